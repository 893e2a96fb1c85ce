// Package checkpoint writes and reads training checkpoints: atomic,
// durable, verifiable folders that a run resumes from after a crash, and
// whose weights PyTorch loads directly.
//
// # Layout
//
// A run's checkpoint dir (runs/<job-id>/checkpoints/) holds one folder per
// checkpoint, named for the optimiser step it was taken after:
//
//	ckpt-1100/
//	ckpt-1200/
//	  model.safetensors  the model's state_dict: parameters and buffers
//	                     under their PyTorch names (conv1.weight,
//	                     bn1.running_mean, fc.weight, …), F32, with
//	                     __metadata__ {"format": "pt"} plus State.ModelMeta
//	                     (gradsync.architecture, .input_shape, .classes,
//	                     .class_names, .mean, .std: jobspec.ModelMetadata);
//	                     loads with
//	                     safetensors.torch.load_file and
//	                     Module.load_state_dict, or models.ReadSafetensors
//	                     and Network.LoadState
//	  optim.safetensors  optimiser state per parameter:
//	                     momentum_buffer.<param> (SGD) or adam.m.<param> and
//	                     adam.v.<param> (Adam, AdamW)
//	  extra.safetensors  compression state (compress.*) and the federated
//	                     server optimiser's state (server.*), opaque here
//	  meta.json          where training stood, and the checksums
//
// All three tensor files are always present (an empty one is a valid
// 16-byte safetensors file). Files other than these four are ignored.
//
// # meta.json
//
//	{
//	  "format": 1,
//	  "job_id": "job-7f3a",
//	  "spec_hash": "sha256:9b1c…",
//	  "step": 1200,
//	  "epoch": 2,
//	  "epoch_consumed": 38400,
//	  "world_size": 4,
//	  "seed": 42,
//	  "rng": {
//	    "dropout": "MDEyMzQ1Njc4OWFiY2RlZg=="
//	  },
//	  "optimizer": {
//	    "name": "sgd"
//	  },
//	  "created": "2025-03-14T09:26:53Z",
//	  "files": {
//	    "extra.safetensors": {
//	      "bytes": 16,
//	      "sha256": "9bbcbf73561f6bc5d0a17ea6a2081feed2d1304e87602d8c502d9a5c4bd85576"
//	    },
//	    "model.safetensors": {
//	      "bytes": 120,
//	      "sha256": "475b98809578362bdedac8cc8f1a15c7b465ced39baa23880bae585fe783ceae"
//	    },
//	    "optim.safetensors": {
//	      "bytes": 112,
//	      "sha256": "7e40033ff82d39ff3c2f49fc35a37ee6ee2119cffa98436a9d9d747a59a0cd18"
//	    }
//	  },
//	  "meta_sha256": "de9e46f8b30361dc8aa194fedd496f3ece74f145ca6b43a9430d697e7f2e1950"
//	}
//
// epoch_consumed is the sampler position: how many leading positions of
// the epoch's global sample order (all ranks together) have been trained
// on; data.ResumeSampler continues the epoch from it with any world size.
// rng values are serialised generator states, base64 as encoding/json
// writes []byte. meta_sha256 is the sha256 of the document as Save encodes
// it (json.MarshalIndent, two-space indent) with meta_sha256 "", so a
// flipped value inside meta.json is caught as well as one in a tensor file.
//
// # Writing and reading
//
// Save writes a checkpoint into a temporary folder, fsyncs every file and
// the folder, renames it to ckpt-<step> and fsyncs the parent; only then
// does it remove older checkpoints beyond the newest keep. A crash at any
// moment leaves either the previous set of checkpoints or the new one,
// plus perhaps a hidden temporary folder that the next Save removes. A
// writer claims its temporary folder with a lock file (flock) beside it,
// so that cleaning up never removes the folder of another writer still
// at work in the same dir (templock.go).
//
// Latest returns the newest checkpoint that verifies: meta.json parses and
// matches meta_sha256, the folder name matches its step, every tensor
// file has the recorded size and sha256 and is well-formed safetensors.
// A checkpoint that fails is never loaded; Latest moves on to the next
// older one and returns the failures as Skipped, with the reason, for the
// caller to report.
//
//	s := &checkpoint.State{
//		Meta:    checkpoint.Meta{JobID: id, Step: step, Epoch: epoch, EpochConsumed: pos, WorldSize: world, Seed: seed},
//		Tensors: net.State(),
//	}
//	s.CaptureSGD(opt, net.Segments())
//	path, err := checkpoint.Save(dir, s, keep)
//
//	s, path, skipped, err := checkpoint.Latest(dir)
//	for _, sk := range skipped {
//		log.Warn("checkpoint skipped", "path", sk.Path, "err", sk.Err)
//	}
//	switch {
//	case errors.Is(err, checkpoint.ErrNoCheckpoint):
//		// start from scratch
//	case err != nil:
//		return err
//	default:
//		err = net.LoadState(s.Tensors)
//		err = s.RestoreSGD(opt, net.Segments())
//	}
//
// A checkpoint whose tensors arrive in parts (a pipeline job's stages,
// one after the other) is written with a Writer: NewWriter takes every
// tensor's name, dtype and shape, from which the safetensors headers and
// each tensor's offset follow, so Put writes each tensor's bytes in place
// as it arrives and the writer never holds them all; Commit installs the
// folder as Save does, byte for byte the files Save writes.
//
// One process writes a dir at a time. Durability against power loss rests
// on fsync doing what it says; the crash test kills the writer (SIGKILL),
// which exercises atomicity, not the disk's cache.
package checkpoint
