package data

import (
	"math"
	"math/bits"
	"math/rand/v2"
)

// rng is the package's random source. The derivations (bounded integers,
// floats, normals, gammas, shuffles) are written here rather than taken from
// math/rand/v2 so that seeded outputs, and the golden files that pin them,
// stay the same across Go releases. Not safe for concurrent use.
type rng struct {
	src      rand.PCG
	spare    float64 // the polar method's second normal, if hasSpare
	hasSpare bool
}

// Stream identifiers keep the generators of different uses independent even
// when they are given the same seed.
const (
	streamSampler uint64 = iota + 1
	streamIID
	streamDirichlet
	streamShards
	streamLabel
	streamSyntheticTemplates
	streamSyntheticTrain
	streamSyntheticTest
)

func newRNG(seed int64, stream uint64) rng {
	s := splitmix64(uint64(seed) ^ splitmix64(stream))
	var r rng
	r.src.Seed(s, splitmix64(s))
	return r
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// intn returns a uniform integer in [0, n) (Lemire's method). n must be > 0.
func (r *rng) intn(n int) int {
	un := uint64(n)
	hi, lo := bits.Mul64(r.src.Uint64(), un)
	if lo < un {
		thresh := -un % un
		for lo < thresh {
			hi, lo = bits.Mul64(r.src.Uint64(), un)
		}
	}
	return int(hi)
}

// float64 returns a uniform float in [0, 1).
func (r *rng) float64() float64 {
	return float64(r.src.Uint64()>>11) / (1 << 53)
}

// openFloat64 returns a uniform float in (0, 1).
func (r *rng) openFloat64() float64 {
	for {
		if u := r.float64(); u > 0 {
			return u
		}
	}
}

// normal returns a standard normal variate (Marsaglia's polar method, which
// yields two at a time).
func (r *rng) normal() float64 {
	if r.hasSpare {
		r.hasSpare = false
		return r.spare
	}
	for {
		u := 2*r.float64() - 1
		v := 2*r.float64() - 1
		s := u*u + v*v
		if s > 0 && s < 1 {
			f := math.Sqrt(-2 * math.Log(s) / s)
			r.spare, r.hasSpare = v*f, true
			return u * f
		}
	}
}

// approxNormal returns an approximately standard normal variate, the
// standardised sum of four 16-bit uniforms from one draw (Irwin–Hall): cheap
// enough for per-pixel noise, bounded to ±3.46.
func (r *rng) approxNormal() float64 {
	x := r.src.Uint64()
	sum := x&0xffff + x>>16&0xffff + x>>32&0xffff + x>>48
	// Each lane is uniform on {0..65535}: mean 32767.5, variance (65536²−1)/12.
	const mean, sd = 4 * 32767.5, 37837.22724 // sd = sqrt(4·(65536²−1)/12)
	return (float64(sum) - mean) / sd
}

// logGamma returns log(X) for X ~ Gamma(shape, 1), shape > 0. Working in logs
// keeps tiny shapes (Dirichlet α = 0.01) from underflowing to zero.
// Marsaglia and Tsang (2000), with the shape < 1 boost X = Y·U^(1/shape).
func (r *rng) logGamma(shape float64) float64 {
	boost := 0.0
	if shape < 1 {
		boost = math.Log(r.openFloat64()) / shape
		shape++
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := r.normal()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := r.openFloat64()
		if math.Log(u) < 0.5*x*x+d-d*v+d*math.Log(v) {
			return math.Log(d*v) + boost
		}
	}
}

// dirichlet fills dst with a draw from Dirichlet(alpha, …, alpha).
func (r *rng) dirichlet(dst []float64, alpha float64) {
	maxLog := math.Inf(-1)
	for i := range dst {
		dst[i] = r.logGamma(alpha)
		maxLog = max(maxLog, dst[i])
	}
	sum := 0.0
	for i := range dst {
		dst[i] = math.Exp(dst[i] - maxLog)
		sum += dst[i]
	}
	for i := range dst {
		dst[i] /= sum
	}
}

// shuffle permutes s uniformly (Fisher–Yates).
func shuffle[T any](r *rng, s []T) {
	for i := len(s) - 1; i > 0; i-- {
		j := r.intn(i + 1)
		s[i], s[j] = s[j], s[i]
	}
}

// perm returns a uniform permutation of 0..n-1.
func (r *rng) perm(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	shuffle(r, p)
	return p
}
