package data

import "fmt"

// Position returns the sampler position (see ResumeSampler) after steps
// more lockstep steps of batch indices per rank on world ranks over n
// examples, starting at the given epoch with consumed positions of its
// global order done: the epoch in progress and its consumed positions,
// and whether the last step ended an epoch (then consumed is 0 and epoch
// is the next one). It is the trainer's arithmetic: an epoch resumed at
// consumed > 0 runs ResumeSteps(n, consumed, world, batch) steps, a whole
// one ResumeSteps(n, 0, world, batch), and each step consumes batch·world
// positions (clamped to n). The parameter server uses it to know where
// the workers' samplers are when it writes a checkpoint. n < 1, world <
// 1, batch < 1, or negative consumed or steps panic.
func Position(n, world, batch, epoch int, consumed int64, steps int64) (e int, c int64, epochEnd bool) {
	if n < 1 || world < 1 || batch < 1 || consumed < 0 || steps < 0 {
		panic(fmt.Sprintf("data: Position: n = %d, world = %d, batch = %d, consumed = %d, steps = %d: want n, world, batch ≥ 1 and consumed, steps ≥ 0",
			n, world, batch, consumed, steps))
	}
	per := int64(batch) * int64(world)
	if consumed > 0 {
		nb := int64(ResumeSteps(n, int(min(consumed, int64(n))), world, batch))
		switch {
		case steps < nb:
			return epoch, min(consumed+steps*per, int64(n)), false
		case steps == nb:
			return epoch + 1, 0, true
		}
		steps -= nb
		epoch++
	}
	full := int64(ResumeSteps(n, 0, world, batch))
	epoch += int(steps / full)
	if r := steps % full; r > 0 {
		return epoch, min(r*per, int64(n)), false
	}
	return epoch, 0, steps > 0
}
