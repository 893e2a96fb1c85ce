package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// BellName is the bell socket's file name, beside SocketName in the
// directory Listen makes.
//
// The bell is the agent's fast path for the call a training step makes
// most: the all-reduce of a range of the shared region (a gradient
// bucket). Through gRPC that call costs the script about a millisecond
// (a future, HTTP/2 framing, the C core's threads) and the worker about
// as much (the gRPC server, protobuf, a goroutine per stream): more than
// the all-reduce itself of a small bucket over shared memory, and on
// cores the script trains on. Through the bell it is a 32-byte write and
// a 24-byte read on a Unix socket. Everything else (Init, layouts,
// broadcasts, barriers, reports, all-reduces of data in the message)
// stays on the gRPC service, and both share one sequence of collective
// numbers: a bell request is an AllReduce of a shm range, run by the
// same code in the same turn-taking.
//
// Frames, little-endian:
//
//	request (32 bytes): magic "GSB1" (uint32 0x31425347), op uint16
//	  (1: all-reduce of a shared range), flags uint16 (bit 0: average),
//	  seq int64, offset int64, length int64
//	reply (24 bytes + message): magic, code uint32 (a gRPC code, 0 OK),
//	  seq int64, message length uint32, 4 zero bytes, then the message
//	  (UTF-8, at most maxBellMessage bytes; empty when OK)
//
// Replies come as the collectives end, which may be out of number order.
// A request that is malformed (wrong magic, unknown op or flags) is
// answered with InvalidArgument under seq −1 and the connection is
// closed: the stream cannot be trusted after it. A well-formed request
// that fails (a range outside the region, a broken ring) is answered with
// its status under its seq. The connection's calls are cancelled when it
// closes (the script exited), as gRPC's are.
const BellName = "agent.bell"

const (
	bellMagic       = 0x31425347 // "GSB1"
	bellRequestLen  = 32
	bellReplyLen    = 24
	bellOpAllReduce = 1
	bellFlagAverage = 1
	// maxBellMessage bounds a reply's message.
	maxBellMessage = 4096
	// maxBellInFlight bounds the requests of one connection under way;
	// more are refused with ResourceExhausted.
	maxBellInFlight = 4096
	// bellWriteTimeout bounds a reply's write (a script that stops
	// reading its replies).
	bellWriteTimeout = 30 * time.Second
)

// bellRequest is a decoded request frame.
type bellRequest struct {
	op, flags uint16
	seq       int64
	offset    int64
	length    int64
}

// errBellFrame: a request frame that is not one.
var errBellFrame = errors.New("agent bell: malformed request")

// decodeBell decodes one request frame (len(b) == bellRequestLen).
func decodeBell(b []byte) (bellRequest, error) {
	if len(b) != bellRequestLen || binary.LittleEndian.Uint32(b) != bellMagic {
		return bellRequest{}, errBellFrame
	}
	r := bellRequest{
		op:     binary.LittleEndian.Uint16(b[4:]),
		flags:  binary.LittleEndian.Uint16(b[6:]),
		seq:    int64(binary.LittleEndian.Uint64(b[8:])),
		offset: int64(binary.LittleEndian.Uint64(b[16:])),
		length: int64(binary.LittleEndian.Uint64(b[24:])),
	}
	if r.op != bellOpAllReduce || r.flags&^bellFlagAverage != 0 || r.seq < 0 {
		return bellRequest{}, errBellFrame
	}
	return r, nil
}

// encodeBellReply encodes a reply frame for seq with err's status.
func encodeBellReply(seq int64, err error) []byte {
	st := status.Convert(err)
	msg := st.Message()
	if err == nil {
		msg = ""
	}
	if len(msg) > maxBellMessage {
		msg = msg[:maxBellMessage]
	}
	b := make([]byte, bellReplyLen+len(msg))
	binary.LittleEndian.PutUint32(b, bellMagic)
	binary.LittleEndian.PutUint32(b[4:], uint32(st.Code()))
	binary.LittleEndian.PutUint64(b[8:], uint64(seq))
	binary.LittleEndian.PutUint32(b[16:], uint32(len(msg)))
	copy(b[bellReplyLen:], msg)
	return b
}

// serveBell answers one connection's requests until it closes or ctx is
// done, each request in its own goroutine (it waits for its turn among
// the collectives, as a gRPC call does); it returns once every one has
// ended.
func (s *Server) serveBell(ctx context.Context, c net.Conn, log *slog.Logger) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		c.Close()
		wg.Wait()
	}()
	wg.Add(1)
	go func() { // owned by serveBell: unblocks the read when ctx ends
		defer wg.Done()
		<-ctx.Done()
		c.Close()
	}()
	var wmu sync.Mutex
	reply := func(b []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		_ = c.SetWriteDeadline(time.Now().Add(bellWriteTimeout))
		if _, err := c.Write(b); err != nil {
			cancel() // the script no longer reads: its calls are cancelled
		}
	}
	sem := make(chan struct{}, maxBellInFlight)
	buf := make([]byte, bellRequestLen)
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				log.Debug("agent bell: connection ended", "err", err)
			}
			return
		}
		req, err := decodeBell(buf)
		if err != nil {
			log.Warn("agent bell: malformed request; closing the connection", "frame", buf)
			reply(encodeBellReply(-1, status.Error(codes.InvalidArgument, "malformed bell request (magic, op or flags): the connection is closed")))
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			reply(encodeBellReply(req.seq, status.Errorf(codes.ResourceExhausted, "more than %d bell requests in flight", maxBellInFlight)))
			continue
		}
		wg.Add(1)
		go func() { // owned by serveBell: one collective
			defer func() { <-sem; wg.Done() }()
			_, err := s.AllReduce(ctx, &pb.AllReduceRequest{Seq: req.seq, Average: req.flags&bellFlagAverage != 0,
				Shm: &pb.ShmRange{Offset: req.offset, Length: req.length}})
			reply(encodeBellReply(req.seq, err))
		}()
	}
}
