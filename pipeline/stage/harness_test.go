package stage_test

import (
	"testing"

	"github.com/gradsync/gradsync/pipeline"
	"github.com/gradsync/gradsync/pipeline/stage"
	"github.com/gradsync/gradsync/pipeline/stage/stagetest"
)

// wrapFn may wrap stage s's links (its Prev, then its Next).
type wrapFn func(s int, prev, next stage.Link) (stage.Link, stage.Link)

// newPipeline is S stages over in-process links of capacity messages.
func newPipeline(t testing.TB, j stagetest.Job, sched pipeline.Schedule, S, M, capacity int, wrap wrapFn, cost stage.Cost) *stagetest.Pipeline {
	t.Helper()
	plan, err := pipeline.New(sched, S, M)
	if err != nil {
		t.Fatal(err)
	}
	prevs := make([]stage.Link, S)
	nexts := make([]stage.Link, S)
	for s := range S - 1 {
		next, prev := stage.Pipe(s, capacity)
		nexts[s], prevs[s+1] = next, prev
	}
	if wrap != nil {
		for s := range S {
			prevs[s], nexts[s] = wrap(s, prevs[s], nexts[s])
		}
	}
	return stagetest.New(t, j, plan, prevs, nexts, cost)
}
