package tensorpar

import (
	"context"
	"fmt"
)

// Fuse joins strip-sharded features into whole images before a layer
// that needs them whole (the classifier head): Forward all-gathers every
// rank's rows, so each rank holds the whole (batch, C, H, W) tensor;
// Backward takes the whole tensor's gradient — the same on every rank,
// as the fused features feed a replicated head — and returns this rank's
// rows of it, with no communication.
//
// Communication per step: Forward does one all-gather of
// batch·C·maxRows·W values per rank, maxRows the tallest strip's rows
// (shorter strips are padded, so that every rank passes the same length);
// Backward none.
type Fuse struct {
	C, W   int
	Strips Strips
	Lo, Hi int // this rank's rows

	g        Group
	batch    int
	src, all []float32 // owned scratch: this rank's padded rows, every rank's
	y, dx    []float32 // owned
}

// NewFuse returns rank g.Rank()'s part of fusing images of c channels and
// rows of w values split by strips over g.
func NewFuse(g Group, c, w int, strips Strips) (*Fuse, error) {
	if c < 1 || w < 1 {
		return nil, fmt.Errorf("tensorpar: Fuse: C %d, W %d: want both positive", c, w)
	}
	f := g.Size()
	if len(strips) != f+1 {
		return nil, fmt.Errorf("tensorpar: Fuse: strips %v are not %d strips", []int(strips), f)
	}
	if err := strips.validate(strips[f], f); err != nil {
		return nil, err
	}
	r := g.Rank()
	return &Fuse{C: c, W: w, Strips: strips, Lo: strips[r], Hi: strips[r+1], g: g}, nil
}

// maxRows is the tallest strip's height.
func (l *Fuse) maxRows() int {
	m := 0
	for r := range len(l.Strips) - 1 {
		m = max(m, l.Strips[r+1]-l.Strips[r])
	}
	return m
}

// Forward returns the whole images (batch, C, H, W) from this rank's rows
// x (batch, C, Hi−Lo, W), the same on every rank, owned and valid until
// the next Forward.
func (l *Fuse) Forward(ctx context.Context, x []float32, batch int) ([]float32, error) {
	l.batch = 0
	own, w, c := l.Hi-l.Lo, l.W, l.C
	if batch < 1 || len(x) != batch*c*own*w {
		return nil, fmt.Errorf("tensorpar: Fuse.Forward: len(x) = %d, want batch %d × C %d × %d rows × W %d", len(x), batch, c, own, w)
	}
	f, mr := len(l.Strips)-1, l.maxRows()
	h := l.Strips[f]
	per := batch * c * mr * w // one rank's padded share
	l.src = grow(l.src, per)
	clear(l.src)
	for p := range batch * c {
		copy(l.src[p*mr*w:], x[p*own*w:(p+1)*own*w])
	}
	l.all = grow(l.all, f*per)
	if err := l.g.AllGather(ctx, l.all, l.src); err != nil {
		return nil, fmt.Errorf("tensorpar: Fuse.Forward: %w", err)
	}
	l.y = grow(l.y, batch*c*h*w)
	for r := range f {
		k := (l.Strips[r+1] - l.Strips[r]) * w
		from := l.all[r*per : (r+1)*per]
		for p := range batch * c {
			copy(l.y[(p*h+l.Strips[r])*w:], from[p*mr*w:p*mr*w+k])
		}
	}
	l.batch = batch
	return l.y, nil
}

// Backward returns this rank's rows (batch, C, Hi−Lo, W) of dy, the whole
// images' gradient (the same on every rank); owned, valid until the next
// Backward.
func (l *Fuse) Backward(dy []float32) ([]float32, error) {
	if l.batch == 0 {
		return nil, errNoSpatialForward
	}
	h := l.Strips[len(l.Strips)-1]
	if len(dy) != len(l.y) {
		return nil, fmt.Errorf("tensorpar: Fuse.Backward: len(dy) = %d, want %d", len(dy), len(l.y))
	}
	own, w := l.Hi-l.Lo, l.W
	l.dx = grow(l.dx, l.batch*l.C*own*w)
	for p := range l.batch * l.C {
		copy(l.dx[p*own*w:(p+1)*own*w], dy[(p*h+l.Lo)*w:(p*h+l.Hi)*w])
	}
	return l.dx, nil
}
