package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
)

// Pin makes an unchangeable copy of the checkpoint at path for readers that
// load it later (a recovered generation's ranks): dir/pinned/<tag>/ckpt-N,
// hard-linked where the file system allows, copied otherwise. Save may
// replace or prune ckpt-N itself at any time; the pinned copy is left
// alone (Latest does not list it), so every reader sees the same bytes.
// Pins older than the newest keep are removed.
func Pin(dir, path, tag string, keep int) (string, error) {
	pinRoot := filepath.Join(dir, "pinned")
	dst := filepath.Join(pinRoot, tag, filepath.Base(path))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", fmt.Errorf("checkpoint: pin: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dst), ".pin-*")
	if err != nil {
		return "", fmt.Errorf("checkpoint: pin: %w", err)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("checkpoint: pin: %w", err)
	}
	if testHookPinListed != nil {
		testHookPinListed()
	}
	for _, e := range entries {
		src, to := filepath.Join(path, e.Name()), filepath.Join(tmp, e.Name())
		if err := os.Link(src, to); err != nil {
			b, rerr := os.ReadFile(src)
			if rerr != nil {
				os.RemoveAll(tmp)
				return "", fmt.Errorf("checkpoint: pin: %w", rerr)
			}
			if werr := os.WriteFile(to, b, 0o644); werr != nil {
				os.RemoveAll(tmp)
				return "", fmt.Errorf("checkpoint: pin: %w", werr)
			}
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("checkpoint: pin: %w", err)
	}
	// The pinned copy must verify: a checkpoint replaced while we linked
	// its files would not.
	if _, err := Load(dst); err != nil {
		os.RemoveAll(filepath.Dir(dst))
		return "", err
	}
	prunePins(pinRoot, keep)
	return dst, nil
}

// prunePins keeps the keep most recently modified pins.
func prunePins(root string, keep int) {
	es, err := os.ReadDir(root)
	if err != nil || keep < 1 || len(es) <= keep {
		return
	}
	type pin struct {
		name string
		mod  int64
	}
	var ps []pin
	for _, e := range es {
		if fi, err := e.Info(); err == nil && e.IsDir() {
			ps = append(ps, pin{e.Name(), fi.ModTime().UnixNano()})
		}
	}
	for len(ps) > keep {
		oldest := 0
		for i := range ps {
			if ps[i].mod < ps[oldest].mod {
				oldest = i
			}
		}
		os.RemoveAll(filepath.Join(root, ps[oldest].name))
		ps = append(ps[:oldest], ps[oldest+1:]...)
	}
}

// PinLatest pins the latest checkpoint of dir that verifies (Latest)
// under tag. A writer may replace or prune that checkpoint while its
// files are being linked — a rank writing its checkpoint at stop for the
// step the coordinator is pinning for a recovery — and the pinned copy
// then does not verify: the checkpoint that is latest then is pinned
// instead, up to three times. Where dir holds no checkpoint the error
// wraps ErrNoCheckpoint.
func PinLatest(dir, tag string, keep int) (string, error) {
	var err error
	for range 3 {
		var path string
		if _, path, _, err = Latest(dir); err != nil {
			return "", err
		}
		var pinned string
		if pinned, err = Pin(dir, path, tag, keep); err == nil {
			return pinned, nil
		}
	}
	return "", err
}

// testHookPinListed, when set, runs in Pin once the checkpoint's files
// are listed, before they are linked (tests).
var testHookPinListed func()
