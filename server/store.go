package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"google.golang.org/protobuf/proto"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

var jobsBucket = []byte("jobs")

// store is the durable job store: one bbolt file, one bucket of jobs keyed
// by id, each value a marshalled pb.Job. Every state change is written
// before it is announced, so a restarted server knows every job.
type store struct {
	db *bolt.DB

	mu sync.Mutex // guards written
	// written is the version of each job last written: writes queued
	// under the server's lock run after it, possibly out of order
	// between goroutines, and an older version never replaces a newer.
	written map[string]uint64
}

func openStore(dir string) (*store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("server: data directory: %w", err)
	}
	path := filepath.Join(dir, "gradsync.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("server: %s is locked by another gradsync server (use another --data-dir)", path)
		}
		return nil, fmt.Errorf("server: open job store %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(jobsBucket)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("server: init job store: %w", err)
	}
	return &store{db: db, written: map[string]uint64{}}, nil
}

func (s *store) close() error { return s.db.Close() }

// putJob writes version of job j (versions count up per job from 0),
// unless a later version is already written.
func (s *store) putJob(j *pb.Job, version uint64) error {
	b, err := proto.Marshal(j)
	if err != nil {
		return fmt.Errorf("server: marshal job %s: %w", j.Id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if last, ok := s.written[j.Id]; ok && version <= last {
		return nil
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(jobsBucket).Put([]byte(j.Id), b)
	})
	if err == nil {
		s.written[j.Id] = version
	}
	return err
}

// jobs returns every stored job. A record that does not decode is reported
// (not skipped silently).
func (s *store) jobs() ([]*pb.Job, error) {
	var out []*pb.Job
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(jobsBucket).ForEach(func(k, v []byte) error {
			j := &pb.Job{}
			if err := proto.Unmarshal(v, j); err != nil {
				return fmt.Errorf("server: job record %q is corrupt: %w", k, err)
			}
			out = append(out, j)
			return nil
		})
	})
	return out, err
}
