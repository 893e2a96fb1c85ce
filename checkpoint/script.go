package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Script checkpoints: the files an entrypoint job's script saves into
// the job's checkpoint folder (python/gradsync/torch.py save_checkpoint:
// torch.save of the script's own state, written beside and renamed), one
// per step, named ScriptPrefix + step + ScriptSuffix. Their content is
// the script's; gradsync only finds the newest, for a resumed job
// (GRADSYNC_RESUME_FROM).
const (
	ScriptPrefix = "script-step-"
	ScriptSuffix = ".pt"
)

// LatestScript returns the path of the script checkpoint of the highest
// step in dir: a regular file named ScriptPrefix<step>ScriptSuffix
// (step in canonical decimal). ErrNoCheckpoint when there is none.
func LatestScript(dir string) (string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%w in %s", ErrNoCheckpoint, dir)
		}
		return "", fmt.Errorf("checkpoint: LatestScript: %w", err)
	}
	best, bestStep := "", int64(-1)
	for _, de := range des {
		step, ok := parseScriptName(de.Name())
		if !ok || !de.Type().IsRegular() || step <= bestStep {
			continue
		}
		best, bestStep = de.Name(), step
	}
	if best == "" {
		return "", fmt.Errorf("%w in %s (no %s<step>%s file)", ErrNoCheckpoint, dir, ScriptPrefix, ScriptSuffix)
	}
	return filepath.Join(dir, best), nil
}

// parseScriptName returns the step of a script checkpoint's file name.
func parseScriptName(name string) (int64, bool) {
	rest, ok := strings.CutPrefix(name, ScriptPrefix)
	if !ok {
		return 0, false
	}
	rest, ok = strings.CutSuffix(rest, ScriptSuffix)
	if !ok {
		return 0, false
	}
	step, err := strconv.ParseInt(rest, 10, 64)
	if err != nil || step < 0 || strconv.FormatInt(step, 10) != rest {
		return 0, false
	}
	return step, true
}
