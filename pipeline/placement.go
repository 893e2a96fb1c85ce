package pipeline

import "fmt"

// Coord is where one rank of a pipeline job sits on its mesh: stage Stage
// of data replica Replica, for Stages stages and Replicas replicas.
type Coord struct {
	Rank             int
	Replica, Stage   int
	Replicas, Stages int
}

// Place returns rank's coordinates in a job of world ranks cut into
// stages stages: the ranks of one replica are consecutive, rank r being
// stage r mod S of replica r / S, so a replica's pipeline neighbours are
// adjacent ranks (Prev, Next) and the replicas of a stage (the group that
// all-reduces its gradients, StageGroup) are S apart. It is a pure
// function of the ring job's assignment (rank, world size) and the spec:
// every rank computes the same mesh without asking the coordinator.
func Place(rank, world, stages int) (Coord, error) {
	switch {
	case stages < 1:
		return Coord{}, fmt.Errorf("pipeline: stages must be at least 1, got %d", stages)
	case world < 1 || world%stages != 0:
		return Coord{}, fmt.Errorf("pipeline: %d workers cannot hold replicas of %d stages (want a positive multiple of %d)", world, stages, stages)
	case rank < 0 || rank >= world:
		return Coord{}, fmt.Errorf("pipeline: rank %d out of [0, %d)", rank, world)
	}
	return Coord{Rank: rank, Replica: rank / stages, Stage: rank % stages, Replicas: world / stages, Stages: stages}, nil
}

// RankOf is the rank at stage s of replica d.
func (c Coord) RankOf(d, s int) int { return d*c.Stages + s }

// Prev is the rank of the previous stage of c's replica; -1 on stage 0.
func (c Coord) Prev() int {
	if c.Stage == 0 {
		return -1
	}
	return c.Rank - 1
}

// Next is the rank of the next stage of c's replica; -1 on the last stage.
func (c Coord) Next() int {
	if c.Stage == c.Stages-1 {
		return -1
	}
	return c.Rank + 1
}

// StageGroup is the ranks of c's stage in every replica, replica 0 first:
// the ring over which they all-reduce the stage's gradients. c's place in
// it is c.Replica.
func (c Coord) StageGroup() []int {
	g := make([]int, c.Replicas)
	for d := range g {
		g[d] = c.RankOf(d, c.Stage)
	}
	return g
}
