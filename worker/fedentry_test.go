package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gradsync/gradsync/agent"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestScriptLearnerGone: a script that exits, or takes no task within the
// round's deadline, is gone — stopped, with the reason and its stderr —;
// a task cancelled by the worker (the job ended) is not the script's
// fault.
func TestScriptLearnerGone(t *testing.T) {
	newLearner := func() (*scriptLearner, context.CancelCauseFunc, *error) {
		exited, markExited := context.WithCancelCause(context.Background())
		stopped := new(error)
		l := &scriptLearner{fs: agent.NewFed(agent.FedConfig{}), exited: exited, evalDeadline: time.Hour,
			stop:   func(err error) { *stopped = err },
			stderr: func() string { return "; last lines of its stderr:\nboom" }}
		return l, markExited, stopped
	}
	rs := &pb.RoundStart{Round: 3, DeadlineSeconds: 0.01, LocalEpochs: 1}
	global, delta := make([]float32, 4), make([]float32, 4)

	l, _, stopped := newLearner()
	_, err := l.fit(t.Context(), rs, global, delta)
	var gone *fedLearnerGone
	if !errors.As(err, &gone) || !strings.Contains(gone.reason, "did not ask for its fit task of round 3: its deadline of 10ms passed; last lines of its stderr:\nboom") ||
		*stopped == nil {
		t.Errorf("a script that takes no task by the deadline: %v (stopped: %v); want it gone and stopped", err, *stopped)
	}

	l, markExited, _ := newLearner()
	markExited(errors.New("python3 exited with status 1"))
	_, err = l.evaluate(t.Context(), 3, global)
	if !errors.As(err, &gone) || !strings.Contains(gone.reason, "evaluate task of round 3: python3 exited with status 1") {
		t.Errorf("a script that exited: %v; want it gone, saying how it ended", err)
	}

	l, _, stopped = newLearner()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := l.fit(ctx, &pb.RoundStart{Round: 1, DeadlineSeconds: 60}, global, delta); !errors.Is(err, context.Canceled) || *stopped != nil {
		t.Errorf("a cancelled task: %v (stopped: %v); want context.Canceled, the script left running", err, *stopped)
	}
}
