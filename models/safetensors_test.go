package models

import (
	"bytes"
	"encoding/binary"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// file builds a safetensors file from a literal header and data.
func file(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), data...)
}

func TestSafetensorsRoundTrip(t *testing.T) {
	in := map[string]Tensor{
		"w":      F32Tensor([]int{2, 3}, []float32{1, 2, 3, 4, 5, -6.5}),
		"scalar": F32Tensor([]int{}, []float32{7}),
		"empty":  F32Tensor([]int{0, 4}, nil),
		"labels": {DType: "I64", Shape: []int{2}, Data: binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 3), 1<<40)},
	}
	meta := map[string]string{"format": "pt"}
	var buf bytes.Buffer
	if err := WriteSafetensors(&buf, in, meta); err != nil {
		t.Fatal(err)
	}
	if n := binary.LittleEndian.Uint64(buf.Bytes()); n%8 != 0 {
		t.Fatalf("header length %d not padded to 8", n)
	}
	out, gotMeta, err := ReadSafetensors(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(meta, gotMeta) || len(out) != len(in) {
		t.Fatalf("metadata %v, %d tensors", gotMeta, len(out))
	}
	for name, want := range in {
		got := out[name]
		if got.DType != want.DType || !slices.Equal(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) {
			t.Fatalf("%s: got %+v, want %+v", name, got, want)
		}
	}
	v, err := out["w"].Float32s()
	if err != nil || !slices.Equal(v, []float32{1, 2, 3, 4, 5, -6.5}) {
		t.Fatalf("Float32s = %v, %v", v, err)
	}
	l, err := out["labels"].Int64s()
	if err != nil || !slices.Equal(l, []int64{3, 1 << 40}) {
		t.Fatalf("Int64s = %v, %v", l, err)
	}
	if _, err := out["labels"].Float32s(); err == nil {
		t.Fatal("Float32s of an I64 tensor: no error")
	}
}

func TestSafetensorsRejects(t *testing.T) {
	eight := make([]byte, 8)
	cases := map[string][]byte{
		"short":             {1, 2, 3},
		"header too long":   file(`{}`, nil)[:9],
		"not an object":     file(`[]`, nil),
		"bad json":          file(`{"a":`, nil),
		"duplicate key":     file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight),
		"unknown dtype":     file(`{"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}}`, eight[:4]),
		"unknown key":       file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}`, eight[:4]),
		"key case":          file(`{"a":{"DTYPE":"F32","shape":[1],"data_offsets":[0,4]}}`, eight[:4]),
		"missing shape":     file(`{"a":{"dtype":"F32","data_offsets":[0,4]}}`, eight[:4]),
		"null shape":        file(`{"a":{"dtype":"F32","shape":null,"data_offsets":[0,4]}}`, eight[:4]),
		"negative dim":      file(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, eight[:4]),
		"size mismatch":     file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, eight[:4]),
		"offsets reversed":  file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}`, eight),
		"three offsets":     file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, eight[:4]),
		"past the end":      file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, eight[:4]),
		"gap":               file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight),
		"overlap":           file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, eight[:4]),
		"trailing bytes":    file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, eight),
		"trailing header":   file(`{} x`, nil),
		"metadata non-str":  file(`{"__metadata__":{"a":1}}`, nil),
		"overflowing shape": file(`{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, nil),
	}
	for name, b := range cases {
		if _, _, err := ReadSafetensors(b); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.HasPrefix(err.Error(), "models: safetensors: ") {
			t.Errorf("%s: error %q lacks the package prefix", name, err)
		}
	}
	// padding spaces after the object are allowed, as the format's writers emit them
	if _, _, err := ReadSafetensors(file(`{}      `, nil)); err != nil {
		t.Errorf("padded empty header: %v", err)
	}
	if err := WriteSafetensors(&bytes.Buffer{}, map[string]Tensor{"a": {DType: "F32", Shape: []int{2}, Data: eight[:4]}}, nil); err == nil {
		t.Error("WriteSafetensors accepted a size mismatch")
	}
}

func TestNetworkState(t *testing.T) {
	a, _ := New("resnet8", Options{Seed: 1})
	b, _ := New("resnet8", Options{Seed: 2})
	a.Forward(randn(rand.New(rand.NewPCG(1, 1)), 2*784), 2, true) // move the running statistics
	var buf bytes.Buffer
	if err := WriteSafetensors(&buf, a.State(), nil); err != nil {
		t.Fatal(err)
	}
	st, _, err := ReadSafetensors(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	st["bn1.num_batches_tracked"] = Tensor{DType: "I64", Shape: []int{}, Data: make([]byte, 8)}
	if err := b.LoadState(st); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.Params(), b.Params()) || !slices.Equal(a.Buffers(), b.Buffers()) {
		t.Fatal("LoadState(State()) did not copy the network")
	}
	delete(st, "fc.bias")
	st["extra"] = st["fc.weight"]
	st["bn1.weight"] = F32Tensor([]int{4, 4}, make([]float32, 16))
	before := slices.Clone(b.Params())
	err = b.LoadState(st)
	for _, want := range []string{`missing tensor "fc.bias"`, `unexpected tensor "extra"`, "bn1.weight: shape [4 4], want [16]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadState error %v, want it to mention %s", err, want)
		}
	}
	if !slices.Equal(before, b.Params()) {
		t.Error("a failed LoadState changed the parameters")
	}
}

// FuzzSafetensors checks that the reader never panics, and that whatever
// it accepts survives a write and a second read unchanged, with the
// writer's output a fixed point.
func FuzzSafetensors(f *testing.F) {
	var buf bytes.Buffer
	WriteSafetensors(&buf, map[string]Tensor{
		"a": F32Tensor([]int{2}, []float32{1, 2}),
		"b": {DType: "U8", Shape: []int{3}, Data: []byte{1, 2, 3}},
	}, map[string]string{"k": "v"})
	f.Add(buf.Bytes())
	f.Add(file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4)))
	f.Add(file(`{}`, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		ts, meta, err := ReadSafetensors(b)
		if err != nil {
			return
		}
		var w1 bytes.Buffer
		if err := WriteSafetensors(&w1, ts, meta); err != nil {
			t.Fatalf("rewrite of an accepted file failed: %v", err)
		}
		ts2, meta2, err := ReadSafetensors(w1.Bytes())
		if err != nil {
			t.Fatalf("reread failed: %v", err)
		}
		if !maps.Equal(meta, meta2) || len(ts) != len(ts2) {
			t.Fatalf("metadata or tensor count changed: %v → %v, %d → %d", meta, meta2, len(ts), len(ts2))
		}
		for name, a := range ts {
			b := ts2[name]
			if a.DType != b.DType || !slices.Equal(a.Shape, b.Shape) || !bytes.Equal(a.Data, b.Data) {
				t.Fatalf("tensor %q changed", name)
			}
		}
		var w2 bytes.Buffer
		WriteSafetensors(&w2, ts2, meta2)
		if !bytes.Equal(w1.Bytes(), w2.Bytes()) {
			t.Fatal("writer output is not a fixed point")
		}
	})
}
