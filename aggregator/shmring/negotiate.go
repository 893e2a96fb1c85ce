package shmring

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/gradsync/gradsync/aggregator"
)

// Negotiation steps: the collectives Negotiate runs over the control
// ring are numbered below every training step (which count from 0).
const (
	stepHosts int64 = -1 - iota
	stepSecret
	stepCreated
	stepOffers
	stepConnected
)

// offerLen is an Offer's encoding: the name, the rank and pid (4 bytes
// each) and the nonce.
const offerLen = len(namePrefix) + nameHex + 4 + 4 + 16

// hostID is HostID; tests replace it to place ranks on other hosts.
var hostID = HostID

// Negotiate tries to move the ring's data plane to shared memory. ctl is
// the job's ring as it formed over gRPC (the control plane: its streams
// are the authenticated Collective streams); every rank of it calls
// Negotiate with the same cfg but for Rank and Size, which are ctl's.
// Over ctl the ranks (1) compare their HostIDs (an all-reduce of the
// hash's bytes and of their squares: equal everywhere or not), (2) take
// rank 0's fresh random secret, unless cfg.Secret gives one (a broadcast:
// it travels only on the job's own streams, TLS when the job is secure),
// (3) create their outbound segments and agree that every rank did, (4)
// all-gather their offers and (5) attach the left neighbour's segment and
// agree that every rank did.
//
// It returns the connected ring, or nil and why the ranks stay on gRPC
// (another host, no segment directory, a refused attach: every rank gets
// the same answer, and nothing is left in the directory). An error means
// ctl itself failed: the job cannot go on.
func Negotiate(ctx context.Context, ctl aggregator.Ring, cfg Config, opt aggregator.Options) (*Ring, string, error) {
	cfg.Rank, cfg.Size = ctl.Rank(), ctl.Size()
	n := cfg.Size
	agree := func(step int64, ok bool) (int, error) {
		v := []float32{0}
		if !ok {
			v[0] = 1
		}
		if err := aggregator.AllReduce(ctx, ctl, v, step, opt); err != nil {
			return 0, fmt.Errorf("shmring: negotiation: %w", err)
		}
		return int(v[0]), nil
	}

	// (1) One host?
	id, herr := hostID(cfg.Dir)
	h := sha256.Sum256([]byte(id))
	v := make([]float32, 2*len(h)+1)
	for i, b := range h {
		v[i], v[len(h)+i] = float32(b), float32(int(b)*int(b))
	}
	if herr != nil {
		v[2*len(h)] = 1
	}
	if err := aggregator.AllReduce(ctx, ctl, v, stepHosts, opt); err != nil {
		return nil, "", fmt.Errorf("shmring: negotiation: %w", err)
	}
	if v[2*len(h)] > 0 {
		return nil, fmt.Sprintf("%d rank(s) cannot use shared memory here (rank %d: %v)", int(v[2*len(h)]), cfg.Rank, herr), nil
	}
	for i := range h {
		// Equal bytes everywhere ⇔ n·Σb² = (Σb)² (exact: below 2^24).
		if s, q := float64(v[i]), float64(v[len(h)+i]); float64(n)*q != s*s {
			return nil, "the ranks are on more than one host", nil
		}
	}

	// (2) The job's secret for this ring.
	if len(cfg.Secret) == 0 {
		sec := make([]float32, 32)
		if cfg.Rank == 0 {
			var b [16]byte
			if _, err := rand.Read(b[:]); err != nil {
				return nil, "", fmt.Errorf("shmring: negotiation: secret: %w", err)
			}
			for i, x := range b {
				sec[i] = float32(x)
			}
		}
		if err := aggregator.Broadcast(ctx, ctl, sec, 0, stepSecret, opt); err != nil {
			return nil, "", fmt.Errorf("shmring: negotiation: %w", err)
		}
		cfg.Secret = make([]byte, 16)
		for i := range cfg.Secret {
			cfg.Secret[i] = byte(sec[i])
		}
	}

	// (3) Every rank's outbound segment.
	p, offer, cerr := Create(cfg)
	bad, err := agree(stepCreated, cerr == nil)
	if err != nil || bad > 0 {
		if p != nil {
			p.Close()
		}
		if err != nil {
			return nil, "", err
		}
		return nil, fmt.Sprintf("%d rank(s) could not create a segment (rank %d: %v)", bad, cfg.Rank, cerr), nil
	}

	// (4) The offers, all-gathered (each rank needs its left one).
	mine := make([]float32, offerLen)
	encodeOffer(mine, offer)
	all := make([]float32, n*offerLen)
	if err := aggregator.AllGather(ctx, ctl, all, mine, stepOffers, opt); err != nil {
		p.Close()
		return nil, "", fmt.Errorf("shmring: negotiation: %w", err)
	}
	left := (cfg.Rank - 1 + n) % n
	lo := decodeOffer(all[left*offerLen : (left+1)*offerLen])

	// (5) Attach, and agree that every link is up.
	r, cerr := p.Connect(ctx, lo)
	bad, err = agree(stepConnected, cerr == nil)
	if err != nil || bad > 0 {
		if r != nil {
			r.Close()
		}
		if err != nil {
			return nil, "", err
		}
		why := fmt.Sprintf("%d link(s) could not attach", bad)
		if cerr != nil {
			why += fmt.Sprintf(" (rank %d: %v)", cfg.Rank, cerr)
		}
		return nil, why, nil
	}
	return r, "", nil
}

// encodeOffer writes o's bytes into dst, one byte a value (exact in
// float32, and the sum of zeros and one rank's bytes is that rank's).
func encodeOffer(dst []float32, o Offer) {
	var b [offerLen]byte
	k := copy(b[:], o.Name)
	binary.LittleEndian.PutUint32(b[k:], uint32(o.Rank))
	binary.LittleEndian.PutUint32(b[k+4:], uint32(o.PID))
	copy(b[k+8:], o.Nonce[:])
	for i, x := range b {
		dst[i] = float32(x)
	}
}

func decodeOffer(src []float32) Offer {
	var b [offerLen]byte
	for i := range b {
		b[i] = byte(src[i])
	}
	k := len(namePrefix) + nameHex
	o := Offer{Name: string(b[:k]), Rank: int(binary.LittleEndian.Uint32(b[k:])), PID: int(binary.LittleEndian.Uint32(b[k+4:]))}
	copy(o.Nonce[:], b[k+8:])
	return o
}
