package gradsyncv1

// Hand-written request checks, called by the validator interceptor
// (go-grpc-middleware) before a handler runs; a failure is InvalidArgument.
// Job-spec semantics are checked by package jobspec.

import (
	"errors"
	"fmt"
)

// maxIDLen bounds ids in requests.
const maxIDLen = 128

func checkJobID(id string) error {
	if id == "" {
		return errors.New("job_id is required")
	}
	if len(id) > maxIDLen {
		return fmt.Errorf("job_id is %d bytes long; at most %d allowed", len(id), maxIDLen)
	}
	return nil
}

// Validate checks the request's shape.
func (r *GetJobRequest) Validate() error { return checkJobID(r.GetJobId()) }

// Validate checks the request's shape.
func (r *WatchJobRequest) Validate() error { return checkJobID(r.GetJobId()) }

// Validate checks the request's shape.
func (r *PullRequest) Validate() error { return checkJobID(r.GetJobId()) }

// Validate checks the request's shape.
func (r *CancelJobRequest) Validate() error {
	if err := checkJobID(r.GetJobId()); err != nil {
		return err
	}
	if len(r.GetReason()) > 1024 {
		return fmt.Errorf("reason is %d bytes long; at most 1024 allowed", len(r.GetReason()))
	}
	return nil
}

// Validate checks the request's shape.
func (r *ListJobsRequest) Validate() error {
	if _, ok := JobState_name[int32(r.GetState())]; !ok {
		return fmt.Errorf("state %d is not a job state", r.GetState())
	}
	if r.GetPageSize() < 0 || r.GetPageSize() > 1000 {
		return fmt.Errorf("page_size %d out of range; allowed 0..1000 (0: 100)", r.GetPageSize())
	}
	return nil
}
