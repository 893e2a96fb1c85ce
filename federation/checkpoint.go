package federation

import (
	"time"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/federated"
)

// checkpointer writes a real-client fedavg job's checkpoints into dir.
type checkpointer struct {
	dir  string
	keep int
	meta checkpoint.Meta // the job's: id, spec hash, world size, seed
	// model is model.safetensors's metadata (jobspec.ModelMetadata of
	// the spec: the clients' data stays theirs, so mean and std only
	// where the spec gives them, as for parameter-server jobs).
	model map[string]string
	// Guarded by Driver.mu:
	lastSave time.Time // for every_seconds
	saved    int       // rounds closed at the newest checkpoint on disk (or resumed from)
}

// saveLocked writes a checkpoint of the state after the last closed
// round, unless the newest on disk already is of it ("", nil).
func (d *Driver) saveLocked(now time.Time) (string, error) {
	c := d.ckpt
	if d.closed <= c.saved {
		return "", nil
	}
	snap := federated.NewSnapshot(d.lastRound, d.closed, d.net, d.srv.Global(), d.net.Buffers(), d.strat)
	meta := c.meta
	meta.Created = now
	path, err := federated.SaveCheckpoint(c.dir, snap, meta, c.model, c.keep)
	if path != "" { // written, even if removing older ones failed
		c.saved, c.lastSave = d.closed, now
	}
	return path, err
}
