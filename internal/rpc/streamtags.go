package rpc

import (
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The handshake of the workers' peer streams (Collective's SendFrames,
// Pipeline's Exchange): request metadata naming the job, its generation
// and the sender's place in it (a ring rank, a pipeline stage), and the
// response header by which the receiving endpoint accepts the stream.
// The ASCII keys are lower case as gRPC requires.
const (
	MDJob        = "gradsync-job"
	MDGeneration = "gradsync-generation"
	MDAccepted   = "gradsync-accepted"
)

// StreamTags reads a peer stream's handshake metadata: the job, the
// generation and the sender's index under key (a rank or a stage, named
// kind in messages, in [0, maxIndex]). stream names the stream in errors
// ("ringrpc: SendFrames"). Every error is InvalidArgument.
func StreamTags(md metadata.MD, stream, key, kind string, maxIndex int) (job string, gen uint64, index int, err error) {
	get := func(k string) (string, error) {
		v := md.Get(k)
		if len(v) != 1 {
			return "", status.Errorf(codes.InvalidArgument,
				"%s needs exactly one %q metadata value (got %d); the stream names its job, generation and sender %s", stream, k, len(v), kind)
		}
		return v[0], nil
	}
	if job, err = get(MDJob); err != nil {
		return "", 0, 0, err
	}
	g, err := get(MDGeneration)
	if err != nil {
		return "", 0, 0, err
	}
	if gen, err = strconv.ParseUint(g, 10, 64); err != nil {
		return "", 0, 0, status.Errorf(codes.InvalidArgument, "%s: metadata %s=%q is not an unsigned integer", stream, MDGeneration, g)
	}
	s, err := get(key)
	if err != nil {
		return "", 0, 0, err
	}
	if index, err = strconv.Atoi(s); err != nil || index < 0 || index > maxIndex {
		return "", 0, 0, status.Errorf(codes.InvalidArgument, "%s: metadata %s=%q is not a %s (an integer in [0, %d])", stream, key, s, kind, maxIndex)
	}
	return job, gen, index, nil
}
