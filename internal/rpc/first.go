package rpc

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// First receives the first message of a bidirectional stream and returns
// it with the part that must open the stream (pick returns nil when the
// message carries something else): the preamble every gradsync stream
// handler starts with. rpcName and want name the stream and that part in
// the InvalidArgument error ("the first message on Connect must be a
// hello"). A receive error is returned as it is.
func First[M any, P comparable](recv func() (M, error), pick func(M) P, rpcName, want string) (M, P, error) {
	var zero P
	m, err := recv()
	if err != nil {
		return m, zero, err
	}
	p := pick(m)
	if p == zero {
		return m, zero, status.Errorf(codes.InvalidArgument, "the first message on %s must be a %s", rpcName, want)
	}
	return m, p, nil
}

// CheckLen is the bounds check of an identifier in a request: nil when
// lo ≤ len(v) ≤ hi, else InvalidArgument naming the field and the bounds
// ("join.job_id must be 1..128 bytes, got 0").
func CheckLen(field, v string, lo, hi int) error {
	if len(v) < lo || len(v) > hi {
		return status.Error(codes.InvalidArgument, fmt.Sprintf("%s must be %d..%d bytes, got %d", field, lo, hi, len(v)))
	}
	return nil
}
