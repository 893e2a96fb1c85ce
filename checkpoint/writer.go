package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/gradsync/gradsync/models"
)

// Writer writes one checkpoint folder whose tensors arrive in parts (a
// pipeline job's stages, one after the other), so that the writer never
// holds them all: the safetensors headers of model.safetensors and
// optim.safetensors follow from the tensors' names, dtypes and shapes
// alone, so each tensor's bytes go straight to their offset in the file
// as they arrive. Commit checks that every tensor came, writes
// extra.safetensors and meta.json and installs the folder as Save does;
// the files are byte for byte what Save writes for the same State.
//
// A Writer is used by one goroutine.
type Writer struct {
	dir   string
	tmp   string
	meta  Meta
	files map[string]*partFile // ModelFile, OptimFile
	done  bool
}

// partFile is one tensor file being written: where each tensor's data
// goes (from the start of the file) and which have come.
type partFile struct {
	f       *os.File
	size    int64
	offsets map[string][2]int64
	written map[string]bool
}

// NewWriter starts checkpoint ckpt-<meta.Step> in dir: model and optim
// give every tensor of model.safetensors and optim.safetensors by name
// with its DType and Shape (their Data is ignored), modelMeta what Save
// takes as State.ModelMeta. Meta is validated as Save does; meta.Files is
// ignored. Call Put for every tensor, then Commit, or Abort.
func NewWriter(dir string, meta Meta, modelMeta map[string]string, model, optim map[string]Tensor) (_ *Writer, err error) {
	m, err := prepareMeta(meta)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: NewWriter: %w", err)
	}
	tmp, err := makeTemp(dir, m.Step)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: NewWriter: %w", err)
	}
	w := &Writer{dir: dir, tmp: tmp, meta: m, files: map[string]*partFile{}}
	defer func() {
		if err != nil {
			w.Abort()
		}
	}()
	mm, err := modelMetadata(modelMeta)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: NewWriter: %w", err)
	}
	for _, c := range []struct {
		name    string
		tensors map[string]Tensor
		meta    map[string]string
	}{{ModelFile, model, mm}, {OptimFile, optim, nil}} {
		pf, err := createPart(filepath.Join(tmp, c.name), c.tensors, c.meta)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: NewWriter: %s: %w", c.name, err)
		}
		w.files[c.name] = pf
	}
	return w, nil
}

// errHeaderWritten stops models.WriteSafetensors once it has written the
// header (headerOnly).
var errHeaderWritten = errors.New("header written")

// headerOnly keeps what models.WriteSafetensors writes before the data:
// the header's length and the header.
type headerOnly struct {
	bytes.Buffer
	writes int
}

func (h *headerOnly) Write(p []byte) (int, error) {
	if h.writes == 2 {
		return 0, errHeaderWritten
	}
	h.writes++
	return h.Buffer.Write(p)
}

// safetensorsHeader is the start of the file models.WriteSafetensors
// writes for tensors of these names, dtypes and shapes and metadata (the
// 8-byte length and the header), with each tensor's data offsets from
// the file's start. It runs WriteSafetensors itself on tensors whose data
// all share one zeroed buffer as long as the largest (a header that
// models changes stays the one Save writes).
func safetensorsHeader(tensors map[string]Tensor, metadata map[string]string) ([]byte, map[string][2]int64, int64, error) {
	sizes := map[string]int{}
	longest := 0
	for name, t := range tensors {
		n, err := tensorBytes(t)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("tensor %q: %w", name, err)
		}
		sizes[name] = n
		longest = max(longest, n)
	}
	zero := make([]byte, longest)
	dry := make(map[string]Tensor, len(tensors))
	for name, t := range tensors {
		dry[name] = Tensor{DType: t.DType, Shape: t.Shape, Data: zero[:sizes[name]]}
	}
	var h headerOnly
	if err := models.WriteSafetensors(&h, dry, metadata); err != nil && !errors.Is(err, errHeaderWritten) {
		return nil, nil, 0, err
	}
	hdr := h.Bytes()
	if len(hdr) < 8 || uint64(len(hdr)-8) != binary.LittleEndian.Uint64(hdr) {
		return nil, nil, 0, fmt.Errorf("safetensors header of %d bytes (a changed writer?)", len(hdr))
	}
	offsets := map[string][2]int64{}
	off := int64(len(hdr))
	for _, name := range slices.Sorted(maps.Keys(tensors)) { // WriteSafetensors' order
		offsets[name] = [2]int64{off, off + int64(sizes[name])}
		off += int64(sizes[name])
	}
	return hdr, offsets, off, nil
}

// tensorBytes is the data length of t's dtype and shape (F32, F16, BF16,
// I8 and the other dtypes safetensors names, by element size).
func tensorBytes(t Tensor) (int, error) {
	size := map[string]int{"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}[t.DType]
	if size == 0 {
		return 0, fmt.Errorf("unknown dtype %q", t.DType)
	}
	n := size
	for _, d := range t.Shape {
		if d < 0 || (d > 0 && n > (1<<62)/d) {
			return 0, fmt.Errorf("shape %v", t.Shape)
		}
		n *= d
	}
	return n, nil
}

// createPart creates path with its header written, sized to hold every
// tensor's data.
func createPart(path string, tensors map[string]Tensor, metadata map[string]string) (*partFile, error) {
	hdr, offsets, size, err := safetensorsHeader(tensors, metadata)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	if _, err = f.Write(hdr); err == nil {
		err = f.Truncate(size)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &partFile{f: f, size: size, offsets: offsets, written: map[string]bool{}}, nil
}

// Put writes tensor name of file (ModelFile or OptimFile): its dtype and
// shape must be those NewWriter was given, and it may come only once.
func (w *Writer) Put(file, name string, t Tensor) error {
	pf := w.files[file]
	if pf == nil || w.done {
		return fmt.Errorf("checkpoint: Writer.Put: %q is not a file being written", file)
	}
	off, ok := pf.offsets[name]
	switch {
	case !ok:
		return fmt.Errorf("checkpoint: Writer.Put: %s has no tensor %q", file, name)
	case pf.written[name]:
		return fmt.Errorf("checkpoint: Writer.Put: %s: tensor %q came twice", file, name)
	case int64(len(t.Data)) != off[1]-off[0]:
		return fmt.Errorf("checkpoint: Writer.Put: %s: tensor %q has %d bytes, want %d", file, name, len(t.Data), off[1]-off[0])
	}
	if _, err := pf.f.WriteAt(t.Data, off[0]); err != nil {
		return fmt.Errorf("checkpoint: Writer.Put: %s: %w", file, err)
	}
	pf.written[name] = true
	return nil
}

// Commit finishes the checkpoint once every tensor was Put: extra (as
// State.Extra) is written, every file fsynced and hashed, meta.json
// written, and the folder installed as Save installs it (keep as Save's).
// It returns the folder's path. After an error the folder is gone.
func (w *Writer) Commit(extra map[string]Tensor, keep int) (path string, err error) {
	if w.done {
		return "", errors.New("checkpoint: Writer.Commit: already committed or aborted")
	}
	defer func() {
		if err != nil {
			w.Abort()
		}
	}()
	m := w.meta
	m.Files = make(map[string]File, len(dataFiles))
	for _, name := range []string{ModelFile, OptimFile} {
		pf := w.files[name]
		for t := range pf.offsets {
			if !pf.written[t] {
				return "", fmt.Errorf("checkpoint: Writer.Commit: %s: tensor %q never came", name, t)
			}
		}
		f, err := pf.finish()
		if err != nil {
			return "", fmt.Errorf("checkpoint: Writer.Commit: %s: %w", name, err)
		}
		m.Files[name] = f
	}
	f, err := writeFile(filepath.Join(w.tmp, ExtraFile), func(out io.Writer) error { return models.WriteSafetensors(out, extra, nil) })
	if err != nil {
		return "", fmt.Errorf("checkpoint: Writer.Commit: %s: %w", ExtraFile, err)
	}
	m.Files[ExtraFile] = f
	w.done = true
	return install(w.dir, w.tmp, m, keep)
}

// finish fsyncs and closes the file and returns its size and sha256
// (read back: its parts came in no order).
func (pf *partFile) finish() (File, error) {
	defer func() { pf.f.Close(); pf.f = nil }()
	if err := pf.f.Sync(); err != nil {
		return File{}, err
	}
	if _, err := pf.f.Seek(0, io.SeekStart); err != nil {
		return File{}, err
	}
	h := sha256.New()
	n, err := io.Copy(h, pf.f)
	if err != nil {
		return File{}, err
	}
	if n != pf.size {
		return File{}, fmt.Errorf("%d bytes, want %d", n, pf.size)
	}
	return File{Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// Abort removes the folder being written; it may be called after Commit
// (it then does nothing).
func (w *Writer) Abort() {
	if w.done && w.files == nil {
		return
	}
	for _, pf := range w.files {
		if pf.f != nil {
			pf.f.Close()
		}
	}
	w.files = nil
	if !w.done {
		releaseTemp(w.tmp)
	}
	w.done = true
}

// modelMetadata is model.safetensors's __metadata__: "format": "pt" and
// the caller's (which may not set "format").
func modelMetadata(mm map[string]string) (map[string]string, error) {
	out := map[string]string{"format": "pt"}
	for k, v := range mm {
		if k == "format" {
			return nil, fmt.Errorf("ModelMeta may not set %q (it is \"pt\")", k)
		}
		out[k] = v
	}
	return out, nil
}
