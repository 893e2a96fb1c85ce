package checkpoint

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gradsync/gradsync/models"
)

// FormatVersion is the meta.json format this package writes and reads.
const FormatVersion = 1

// The files of a checkpoint folder.
const (
	ModelFile = "model.safetensors" // State.Tensors: the model's state_dict
	OptimFile = "optim.safetensors" // State.Optim: optimiser state
	ExtraFile = "extra.safetensors" // State.Extra: compression and server-optimiser state
	MetaFile  = "meta.json"         // Meta, with the sha256 of the three files above
)

// dataFiles are the tensor files every checkpoint has, in the order Save
// writes them.
var dataFiles = []string{ModelFile, OptimFile, ExtraFile}

// Prefix is the name of every checkpoint folder before its step:
// ckpt-<step>, the step in decimal without leading zeros.
const Prefix = "ckpt-"

// Folders that Save writes to or moves doomed checkpoints into; a crash
// can leave them behind, and the next Save removes them. Latest ignores
// them.
const (
	tmpPrefix   = ".tmp-"
	trashPrefix = ".trash-"
)

// Tensor is one named tensor: dtype, shape and little-endian data, as
// models.ReadSafetensors returns it. Use models.F32Tensor and
// Tensor.Float32s to convert from and to []float32.
type Tensor = models.Tensor

// State is everything a checkpoint holds.
type State struct {
	Meta Meta
	// Tensors is the model's state_dict: parameters and buffers keyed by
	// PyTorch name (models.Network.State), written to model.safetensors.
	Tensors map[string]Tensor
	// ModelMeta is written to model.safetensors's __metadata__ beside
	// "format": "pt" (which it may not replace): what a user elsewhere
	// needs to use the weights — architecture, input shape, the
	// normalisation's mean and std, class names (jobspec.ModelMetadata's
	// keys). Load returns it (without "format").
	ModelMeta map[string]string
	// Optim is the optimiser state, written to optim.safetensors, keyed
	// as torch.optim's state is per parameter: "momentum_buffer.<param>"
	// for SGD, "adam.m.<param>" and "adam.v.<param>" for Adam (see
	// State.CaptureSGD and State.CaptureAdam).
	Optim map[string]Tensor
	// Extra is other named state, written to extra.safetensors:
	// compression state under "compress." (PowerSGD's Q and error
	// feedback, top-k residuals, …) and the federated server optimiser's
	// state under "server." (FedAdam's moments, FedAvgM's velocity). The
	// package does not interpret it.
	Extra map[string]Tensor
}

// Meta is meta.json: where in training the checkpoint was taken, and the
// checksums that make the folder verifiable.
type Meta struct {
	// Format is FormatVersion.
	Format int `json:"format"`
	// JobID and SpecHash identify the job and the exact spec it ran, so a
	// resume can refuse a checkpoint of another job or a changed spec.
	JobID    string `json:"job_id"`
	SpecHash string `json:"spec_hash"`
	// Step is the number of optimiser steps taken (the folder's name).
	Step int64 `json:"step"`
	// Epoch is the 0-based epoch in progress, and EpochConsumed the
	// sampler position in it: the number of leading positions of the
	// epoch's global order that have been trained on, summed over all
	// ranks (data.ResumeSampler's consumed). A checkpoint at the end of an
	// epoch has Epoch+1 and EpochConsumed 0.
	Epoch         int   `json:"epoch"`
	EpochConsumed int64 `json:"epoch_consumed"`
	// WorldSize is the number of ranks that trained up to here.
	WorldSize int `json:"world_size"`
	// Seed is the job's seed; RNG holds named, serialised random
	// generator states (for example rand.PCG's MarshalBinary), base64 in
	// the JSON.
	Seed int64             `json:"seed"`
	RNG  map[string][]byte `json:"rng,omitempty"`
	// Optimizer names the optimiser whose state is in optim.safetensors.
	Optimizer Optimizer `json:"optimizer"`
	// Created is when the checkpoint was written (UTC).
	Created time.Time `json:"created"`
	// Files gives every tensor file's size and sha256. Save fills it in;
	// its value in the State passed to Save is ignored.
	Files map[string]File `json:"files"`
	// Checksum is the hex sha256 of this document as Save encodes it with
	// Checksum empty, so a changed value in meta.json is detected too.
	Checksum string `json:"meta_sha256"`
}

// Optimizer describes the optimiser state in optim.safetensors.
type Optimizer struct {
	// Name is "sgd", "adam", "adamw", or "" when there is none.
	Name string `json:"name,omitempty"`
	// Steps is the optimiser's own step count (Adam's bias correction).
	Steps int64 `json:"steps,omitempty"`
}

// File is one tensor file's size in bytes and hex sha256.
type File struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Skipped is a checkpoint folder Latest did not load, and why.
type Skipped struct {
	Path string
	Err  error
}

func (s Skipped) String() string { return s.Path + ": " + s.Err.Error() }

// ErrCorrupt marks a checkpoint that fails verification: a missing or
// extra file, a size or sha256 mismatch, a malformed meta.json or
// safetensors file.
var ErrCorrupt = errors.New("checkpoint: corrupt")

// ErrNoCheckpoint is returned by Latest when no checkpoint verifies.
var ErrNoCheckpoint = errors.New("checkpoint: no valid checkpoint")

// Save writes s as the checkpoint folder ckpt-<s.Meta.Step> in dir
// (created if needed) and returns its path. Meta.Format and Meta.Files
// are filled in, and Meta.Created when zero; s is not modified.
//
// The folder appears atomically and durably: the files are written into
// a temporary folder in dir, each fsynced, the folder fsynced, renamed to
// ckpt-<step>, and dir fsynced. Only then are older checkpoints removed,
// keeping the newest keep (keep ≤ 0 keeps all). The new checkpoint
// becomes dir's newest: folders with a higher step belong to an abandoned
// timeline (the run resumed from an earlier checkpoint, typically because
// they failed verification) and are removed, as is an existing folder
// with the same step, which is replaced.
//
// Writers of one dir, in one process or several, may overlap: each
// claims its temporary folder with a lock file beside it, and Save
// removes only the temporary folders whose lock nobody holds (a crashed
// writer's).
func Save(dir string, s *State, keep int) (path string, err error) {
	m, err := prepareMeta(s.Meta)
	if err != nil {
		return "", fmt.Errorf("checkpoint: Save: %w", err)
	}
	m.Files = make(map[string]File, len(dataFiles))
	modelMeta, err := modelMetadata(s.ModelMeta)
	if err != nil {
		return "", fmt.Errorf("checkpoint: Save: %w", err)
	}
	tmp, err := makeTemp(dir, m.Step)
	if err != nil {
		return "", fmt.Errorf("checkpoint: Save: %w", err)
	}
	contents := map[string]struct {
		tensors map[string]Tensor
		meta    map[string]string
	}{
		// "format": "pt" is what safetensors.torch.save_file writes.
		ModelFile: {s.Tensors, modelMeta},
		OptimFile: {s.Optim, nil},
		ExtraFile: {s.Extra, nil},
	}
	for _, name := range dataFiles {
		c := contents[name]
		f, err := writeFile(filepath.Join(tmp, name), func(w io.Writer) error {
			return models.WriteSafetensors(w, c.tensors, c.meta)
		})
		if err != nil {
			releaseTemp(tmp)
			return "", fmt.Errorf("checkpoint: Save: %s: %w", name, err)
		}
		m.Files[name] = f
	}
	return install(dir, tmp, m, keep)
}

// prepareMeta validates m and fills in Format and Created (when zero,
// now; UTC, without a monotonic reading).
func prepareMeta(m Meta) (Meta, error) {
	if m.Step < 0 {
		return Meta{}, fmt.Errorf("step %d < 0", m.Step)
	}
	if m.EpochConsumed < 0 || m.Epoch < 0 || m.WorldSize < 0 {
		return Meta{}, fmt.Errorf("epoch %d, consumed %d, world size %d: none may be negative", m.Epoch, m.EpochConsumed, m.WorldSize)
	}
	m.Format = FormatVersion
	if m.Created.IsZero() {
		m.Created = time.Now()
	}
	m.Created = m.Created.UTC().Round(0)
	return m, nil
}

// install finishes a checkpoint whose tensor files are in tmp (a folder
// in dir, m.Files set): it writes meta.json, fsyncs tmp, renames it to
// ckpt-<step> (replacing one of that step) and prunes dir (see Save).
// tmp is released (removed if it is still there) in every case.
func install(dir, tmp string, m Meta, keep int) (path string, err error) {
	defer releaseTemp(tmp) // renamed, or removed here
	mb, err := encodeMeta(m)
	if err != nil {
		return "", fmt.Errorf("checkpoint: Save: %w", err)
	}
	if _, err := writeFile(filepath.Join(tmp, MetaFile), func(w io.Writer) error {
		_, err := w.Write(mb)
		return err
	}); err != nil {
		return "", fmt.Errorf("checkpoint: Save: %s: %w", MetaFile, err)
	}
	if err := syncDir(tmp); err != nil {
		return "", fmt.Errorf("checkpoint: Save: %w", err)
	}

	name := Prefix + strconv.FormatInt(m.Step, 10)
	path = filepath.Join(dir, name)
	renamed := false
	if _, err := os.Lstat(path); err == nil {
		// rename(2) cannot replace a non-empty folder. Where the file
		// system can, the two are exchanged in one step, so that a reader
		// (the coordinator pinning the latest checkpoint as a rank writes
		// its checkpoint at stop for the same step) never finds
		// ckpt-<step> missing; the old one, now at tmp, is removed after.
		// Elsewhere the old one is moved aside first: a crash in between
		// leaves no ckpt-<step>, the older checkpoints are still there.
		swapped, err := exchange(tmp, path)
		if err != nil {
			return "", fmt.Errorf("checkpoint: Save: replacing %s: %w", name, err)
		}
		if swapped {
			renamed = true
			if testHookReplaced != nil {
				testHookReplaced()
			}
			if err := syncDir(dir); err != nil {
				return "", fmt.Errorf("checkpoint: Save: %w", err)
			}
			if err := os.RemoveAll(tmp); err != nil {
				return "", fmt.Errorf("checkpoint: Save: removing the replaced %s: %w", name, err)
			}
		} else {
			if err := discard(dir, name); err != nil {
				return "", fmt.Errorf("checkpoint: Save: replacing %s: %w", name, err)
			}
			if testHookReplaced != nil {
				testHookReplaced()
			}
		}
	}
	if !renamed {
		if err := os.Rename(tmp, path); err != nil {
			return "", fmt.Errorf("checkpoint: Save: %w", err)
		}
	}
	if err := syncDir(dir); err != nil {
		return "", fmt.Errorf("checkpoint: Save: %w", err)
	}
	if testHookRenamed != nil {
		testHookRenamed()
	}
	if err := prune(dir, m.Step, keep); err != nil {
		return path, fmt.Errorf("checkpoint: Save: %s is written, but removing old checkpoints failed: %w", path, err)
	}
	return path, nil
}

// testHookReplaced, when set, runs in Save as a checkpoint of the same
// step is being replaced, once the old one is out of the way (tests).
var testHookReplaced func()

// testHookRenamed, when set, runs in Save once the new checkpoint is in
// place, before older ones are pruned: the crash test kills the writer
// there.
var testHookRenamed func()

// encodeMeta returns meta.json's bytes for m, setting its checksum.
func encodeMeta(m Meta) ([]byte, error) {
	m.Checksum = ""
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	m.Checksum = hex.EncodeToString(sum[:])
	b, err = json.MarshalIndent(m, "", "  ")
	return append(b, '\n'), err
}

// decodeMeta parses and verifies meta.json.
func decodeMeta(b []byte) (Meta, error) {
	var m Meta
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("%w: %s: %v", ErrCorrupt, MetaFile, err)
	}
	if dec.More() {
		return m, fmt.Errorf("%w: %s: trailing data", ErrCorrupt, MetaFile)
	}
	if m.Format != FormatVersion {
		return m, fmt.Errorf("%w: %s: format %d, this build reads %d", ErrCorrupt, MetaFile, m.Format, FormatVersion)
	}
	want := m.Checksum
	m.Checksum = ""
	enc, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return m, fmt.Errorf("%w: %s: %v", ErrCorrupt, MetaFile, err)
	}
	sum := sha256.Sum256(enc)
	if got := hex.EncodeToString(sum[:]); got != want {
		return m, fmt.Errorf("%w: %s: checksum %s, contents hash to %s", ErrCorrupt, MetaFile, want, got)
	}
	m.Checksum = want
	return m, nil
}

// Load reads and verifies the checkpoint folder at path: meta.json must
// parse and match its checksum, the folder's name must be its step, and
// every tensor file must have the size and sha256 meta.json records and
// be well-formed safetensors. Verification failures wrap ErrCorrupt. The
// returned tensors are the caller's.
func Load(path string) (*State, error) {
	mb, err := os.ReadFile(filepath.Join(path, MetaFile))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s: missing", ErrCorrupt, MetaFile)
		}
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	m, err := decodeMeta(mb)
	if err != nil {
		return nil, err
	}
	if base := filepath.Base(path); base != Prefix+strconv.FormatInt(m.Step, 10) {
		return nil, fmt.Errorf("%w: folder %s holds step %d", ErrCorrupt, base, m.Step)
	}
	if got := slices.Sorted(maps.Keys(m.Files)); !slices.Equal(got, slices.Sorted(slices.Values(dataFiles))) {
		return nil, fmt.Errorf("%w: %s lists files %v, want %v", ErrCorrupt, MetaFile, got, dataFiles)
	}
	s := &State{Meta: m}
	dst := map[string]*map[string]Tensor{ModelFile: &s.Tensors, OptimFile: &s.Optim, ExtraFile: &s.Extra}
	for _, name := range dataFiles {
		want := m.Files[name]
		b, err := os.ReadFile(filepath.Join(path, name))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("%w: %s: missing", ErrCorrupt, name)
			}
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		if int64(len(b)) != want.Bytes {
			return nil, fmt.Errorf("%w: %s: %d bytes, meta.json says %d", ErrCorrupt, name, len(b), want.Bytes)
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != want.SHA256 {
			return nil, fmt.Errorf("%w: %s: sha256 %s, meta.json says %s", ErrCorrupt, name, got, want.SHA256)
		}
		t, meta, err := models.ReadSafetensors(b)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, name, err)
		}
		*dst[name] = t
		if name == ModelFile {
			delete(meta, "format")
			if len(meta) > 0 {
				s.ModelMeta = meta
			}
		}
	}
	return s, nil
}

// Latest loads the newest checkpoint in dir that verifies (see Load) and
// returns it with its path. Folders newer than it that do not verify are
// returned in skipped with the reason; the caller should report them, as
// they mean lost progress or a damaged disk. When none verifies, or dir
// does not exist, the error wraps ErrNoCheckpoint.
func Latest(dir string) (s *State, path string, skipped []Skipped, err error) {
	entries, err := list(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", nil, fmt.Errorf("%w in %s", ErrNoCheckpoint, dir)
		}
		return nil, "", nil, fmt.Errorf("checkpoint: Latest: %w", err)
	}
	for _, e := range slices.Backward(entries) {
		p := filepath.Join(dir, e.name)
		if !e.dir {
			skipped = append(skipped, Skipped{p, fmt.Errorf("%w: not a folder", ErrCorrupt)})
			continue
		}
		s, err := Load(p)
		if err != nil {
			skipped = append(skipped, Skipped{p, err})
			continue
		}
		return s, p, skipped, nil
	}
	return nil, "", skipped, fmt.Errorf("%w in %s (%d skipped)", ErrNoCheckpoint, dir, len(skipped))
}

// entry is a ckpt-<step> name in a checkpoint dir.
type entry struct {
	name string
	step int64
	dir  bool
}

// list returns dir's ckpt-<step> entries sorted by step.
func list(dir string) ([]entry, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []entry
	for _, de := range des {
		step, ok := parseName(de.Name())
		if !ok {
			continue
		}
		out = append(out, entry{de.Name(), step, de.IsDir()})
	}
	slices.SortFunc(out, func(a, b entry) int { return cmpInt64(a.step, b.step) })
	return out, nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// parseName returns the step of a folder named ckpt-<step>, the step in
// canonical decimal.
func parseName(name string) (int64, bool) {
	rest, ok := strings.CutPrefix(name, Prefix)
	if !ok {
		return 0, false
	}
	step, err := strconv.ParseInt(rest, 10, 64)
	if err != nil || step < 0 || strconv.FormatInt(step, 10) != rest {
		return 0, false
	}
	return step, true
}

// prune removes the checkpoints other than the newest keep with step ≤
// step, and every one with a higher step.
func prune(dir string, step int64, keep int) error {
	entries, err := list(dir)
	if err != nil {
		return err
	}
	var errs []error
	kept := 0
	for _, e := range slices.Backward(entries) {
		if e.step <= step && (keep <= 0 || kept < keep) {
			kept++
			continue
		}
		if err := discard(dir, e.name); err != nil {
			errs = append(errs, err)
		}
	}
	removeLeftovers(dir)
	return errors.Join(errs...)
}

// discard renames dir/name to a trash folder, which is atomic, makes the
// rename durable, then removes the trash: a crash can leave trash, never
// a half-deleted ckpt-<step>.
func discard(dir, name string) error {
	trash := filepath.Join(dir, trashPrefix+name)
	if err := os.RemoveAll(trash); err != nil { // a crashed writer's
		return err
	}
	if err := os.Rename(filepath.Join(dir, name), trash); err != nil {
		return err
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	return os.RemoveAll(trash)
}

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// writeFile creates path (which must not exist), writes it with write,
// fsyncs and closes it, and returns its size and sha256.
func writeFile(path string, write func(io.Writer) error) (File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return File{}, err
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	bw := bufio.NewWriterSize(cw, 1<<20)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return File{}, err
	}
	return File{Bytes: cw.n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// syncDir fsyncs a folder, making the creation, removal and renaming of
// its entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
