//go:build linux

package shmring

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
)

// pairSlots is pair with a given number of slots per link.
func pairSlots(t *testing.T, slots int) [2]*Ring {
	t.Helper()
	dir := t.TempDir()
	var ps [2]*Pending
	var offers [2]Offer
	for i := range 2 {
		var err error
		ps[i], offers[i], err = Create(Config{Dir: dir, JobID: "j", Rank: i, Size: 2, Secret: testSecret, MaxFrameElems: 64, Slots: slots})
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // only a bug waits for it
	defer cancel()
	var rings [2]*Ring
	var errs [2]error
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { rings[i], errs[i] = ps[i].Connect(ctx, offers[1-i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	t.Cleanup(func() { rings[0].Close(); rings[1].Close() })
	return rings
}

// TestBackpressure: with one slot, a sender can be at most one frame
// ahead; frames arrive in order, each with the values it had when
// SendRight returned (SendRight copies them).
func TestBackpressure(t *testing.T) {
	rings := pairSlots(t, 1)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // only a bug waits for it
	defer cancel()
	const frames = 50
	sendErr := make(chan error, 1)
	go func() {
		buf := make([]float32, 3)
		for i := range frames {
			buf[0], buf[1], buf[2] = float32(i), float32(-i), 7
			if err := rings[0].SendRight(ctx, aggregator.Frame{Op: aggregator.OpBroadcast, Step: int64(i), Offset: i, Data: buf[:i%4]}); err != nil {
				sendErr <- err
				return
			}
			buf[0] = -1 // the frame already sent must not see this
		}
		sendErr <- nil
	}()
	for i := range frames {
		f, err := rings[1].RecvLeft(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if f.Step != int64(i) || f.Offset != i || f.Op != aggregator.OpBroadcast || len(f.Data) != i%4 {
			t.Fatalf("frame %d: got %+v", i, f)
		}
		want := []float32{float32(i), float32(-i), 7}
		for j, v := range f.Data {
			if v != want[j] {
				t.Fatalf("frame %d: Data %v, want %v", i, f.Data, want[:i%4])
			}
		}
	}
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
}

// TestCloseUnblocks: a SendRight waiting for a full link returns
// ErrClosed when its own ring closes, and a PeerError naming the
// receiver when the receiver closes.
func TestCloseUnblocks(t *testing.T) {
	for _, who := range []string{"sender", "receiver"} {
		t.Run(who, func(t *testing.T) {
			rings := pairSlots(t, 1)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // only a bug waits for it
			defer cancel()
			if err := rings[0].SendRight(ctx, aggregator.Frame{Data: []float32{1}}); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- rings[0].SendRight(ctx, aggregator.Frame{Data: []float32{2}}) }() // the link is full
			if who == "sender" {
				rings[0].Close()
				if err := <-done; !errors.Is(err, aggregator.ErrClosed) {
					t.Errorf("SendRight: %v, want ErrClosed", err)
				}
				return
			}
			rings[1].Close()
			err := <-done
			if pe := new(aggregator.PeerError); !errors.As(err, &pe) || pe.Rank != 1 || !errors.Is(err, aggregator.ErrPeerGone) {
				t.Errorf("SendRight: %v, want a PeerError naming rank 1", err)
			}
		})
	}
}

// TestRecvCancelled: a RecvLeft waiting on an empty link returns the
// context's error once it ends.
func TestRecvCancelled(t *testing.T) {
	rings := pairSlots(t, 2)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := rings[1].RecvLeft(ctx)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("RecvLeft: %v, want context.Canceled", err)
	}
}

// TestStats: the statistics the worker reads from a ring (as from
// ringrpc's) count what the collectives did.
func TestStats(t *testing.T) {
	// The worker's interfaces (worker/straggler.go, worker/ringsync.go).
	var _ interface {
		WaitStats() (collectives int64, waited time.Duration)
		FrameCounts() (sent, arrived int64)
		LeftIdle() time.Duration
		Traffic() (sent, received int64, right, left string)
		Shutdown(ctx context.Context) error
	} = (*Ring)(nil)

	rings := pair(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // only a bug waits for it
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, r := range rings {
		wg.Go(func() {
			buf := make([]float32, 1000)
			for step := int64(1); step <= 2 && errs[i] == nil; step++ {
				errs[i] = aggregator.AllReduce(ctx, r, buf, step, aggregator.Options{MaxFrameElems: 50})
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	for i, r := range rings {
		other := rings[1-i]
		if c, _ := r.WaitStats(); c != 2 {
			t.Errorf("rank %d: WaitStats counts %d collectives, want 2", i, c)
		}
		sent, _ := r.FrameCounts()
		_, arrived := other.FrameCounts()
		// Each all-reduce of 1000 values over 2 ranks sends a chunk of
		// 500 in each phase, in frames of 50.
		if sent != 40 || arrived != sent {
			t.Errorf("rank %d sent %d frames, rank %d saw %d arrive; want 40", i, sent, 1-i, arrived)
		}
		bs, _, right, left := r.Traffic()
		_, br, _, _ := other.Traffic()
		if bs != 40*50*4 || br != bs || right != left || right != fmt.Sprintf("shm:rank%d", 1-i) {
			t.Errorf("rank %d: Traffic sent %d bytes (rank %d received %d), peers %q %q", i, bs, 1-i, br, right, left)
		}
		if r.LeftIdle() < 0 {
			t.Errorf("rank %d: LeftIdle %v", i, r.LeftIdle())
		}
	}
	if err := rings[0].Shutdown(ctx); err != nil {
		t.Error(err)
	}
}
