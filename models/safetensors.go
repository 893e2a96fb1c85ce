package models

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
)

// Tensor is one named tensor of a safetensors file: its dtype (as the
// format spells it: "F32", "I64", …), shape, and little-endian row-major
// data of exactly product(Shape)·size(DType) bytes.
type Tensor struct {
	DType string
	Shape []int
	Data  []byte
}

// dtypeSizes are the element sizes of the dtypes this package accepts.
var dtypeSizes = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// maxHeader bounds the JSON header, as the reference implementation does
// (100 MB), so a corrupt length cannot make a reader allocate gigabytes.
const maxHeader = 100 << 20

// F32Tensor returns a float32 tensor holding a copy of v with the given
// shape; it panics if the shape does not hold len(v) values.
func F32Tensor(shape []int, v []float32) Tensor {
	if n, ok := numel(shape); !ok || n != len(v) {
		panic(fmt.Sprintf("models: F32Tensor: shape %v does not hold %d values", shape, len(v)))
	}
	data := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x))
	}
	return Tensor{DType: "F32", Shape: slices.Clone(shape), Data: data}
}

// Float32s decodes an F32 tensor's data.
func (t Tensor) Float32s() ([]float32, error) {
	if t.DType != "F32" {
		return nil, fmt.Errorf("models: tensor is %s, not F32", t.DType)
	}
	if len(t.Data)%4 != 0 {
		return nil, fmt.Errorf("models: F32 tensor has %d bytes", len(t.Data))
	}
	v := make([]float32, len(t.Data)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return v, nil
}

// Int64s decodes an I64 tensor's data.
func (t Tensor) Int64s() ([]int64, error) {
	if t.DType != "I64" {
		return nil, fmt.Errorf("models: tensor is %s, not I64", t.DType)
	}
	if len(t.Data)%8 != 0 {
		return nil, fmt.Errorf("models: I64 tensor has %d bytes", len(t.Data))
	}
	v := make([]int64, len(t.Data)/8)
	for i := range v {
		v[i] = int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
	}
	return v, nil
}

// numel returns the product of shape, and false if a dimension is
// negative or the product overflows.
func numel(shape []int) (int, bool) {
	const limit = math.MaxInt / 8 // so that count·(element size) cannot overflow either
	n := 1
	for _, d := range shape {
		if d < 0 || (d > 0 && n > limit/d) {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// headerEntry is one tensor's entry in the JSON header.
type headerEntry struct {
	DType       string `json:"dtype"`
	Shape       []int  `json:"shape"`
	DataOffsets [2]int `json:"data_offsets"`
}

// ReadSafetensors parses a safetensors file held in b. It is strict: the
// header must be one JSON object without duplicate or unknown keys, every
// dtype known, every tensor's byte length equal to its shape's, and the
// tensors must tile the data section exactly (no gaps, no overlaps, no
// trailing bytes). The returned tensors' Data alias b.
func ReadSafetensors(b []byte) (tensors map[string]Tensor, metadata map[string]string, err error) {
	if len(b) < 8 {
		return nil, nil, fmt.Errorf("models: safetensors: %d bytes, shorter than the 8-byte header length", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > maxHeader || n > uint64(len(b)-8) {
		return nil, nil, fmt.Errorf("models: safetensors: header length %d exceeds the file (%d bytes) or the %d-byte limit", n, len(b), maxHeader)
	}
	header, data := b[8:8+n], b[8+n:]
	if len(header) == 0 || header[0] != '{' {
		return nil, nil, errors.New("models: safetensors: header is not a JSON object")
	}
	raw, err := decodeObject(header)
	if err != nil {
		return nil, nil, fmt.Errorf("models: safetensors: header: %w", err)
	}
	tensors = make(map[string]Tensor, len(raw))
	type span struct {
		name       string
		begin, end int
	}
	spans := make([]span, 0, len(raw))
	for name, msg := range raw {
		if name == "__metadata__" {
			if metadata, err = decodeMetadata(msg); err != nil {
				return nil, nil, fmt.Errorf("models: safetensors: __metadata__: %w", err)
			}
			continue
		}
		e, err := decodeEntry(msg)
		if err != nil {
			return nil, nil, fmt.Errorf("models: safetensors: tensor %q: %w", name, err)
		}
		size, ok := dtypeSizes[e.DType]
		if !ok {
			return nil, nil, fmt.Errorf("models: safetensors: tensor %q has unknown dtype %q", name, e.DType)
		}
		count, ok := numel(e.Shape)
		if !ok {
			return nil, nil, fmt.Errorf("models: safetensors: tensor %q has invalid shape %v", name, e.Shape)
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin < 0 || end < begin || end > len(data) {
			return nil, nil, fmt.Errorf("models: safetensors: tensor %q has offsets [%d, %d] outside the %d data bytes", name, begin, end, len(data))
		}
		if count*size != end-begin {
			return nil, nil, fmt.Errorf("models: safetensors: tensor %q: %d bytes for %s%v (want %d·%d)", name, end-begin, e.DType, e.Shape, count, size)
		}
		tensors[name] = Tensor{DType: e.DType, Shape: e.Shape, Data: data[begin:end:end]}
		spans = append(spans, span{name, begin, end})
	}
	slices.SortFunc(spans, func(a, b span) int {
		if a.begin != b.begin {
			return a.begin - b.begin
		}
		return a.end - b.end
	})
	pos := 0
	for _, s := range spans {
		if s.begin != pos {
			return nil, nil, fmt.Errorf("models: safetensors: tensor %q starts at byte %d, want %d (gap or overlap)", s.name, s.begin, pos)
		}
		pos = s.end
	}
	if pos != len(data) {
		return nil, nil, fmt.Errorf("models: safetensors: tensors cover %d of %d data bytes", pos, len(data))
	}
	return tensors, metadata, nil
}

// decodeEntry decodes one tensor's header entry, which must have exactly
// the keys dtype, shape and data_offsets (encoding/json alone would match
// keys case-insensitively and accept missing ones).
func decodeEntry(msg json.RawMessage) (headerEntry, error) {
	var e headerEntry
	if len(msg) == 0 || msg[0] != '{' {
		return e, errors.New("entry is not a JSON object")
	}
	m, err := decodeObject(msg)
	if err != nil {
		return e, err
	}
	for k := range m {
		if k != "dtype" && k != "shape" && k != "data_offsets" {
			return e, fmt.Errorf("unknown key %q", k)
		}
	}
	var offsets []int
	for _, f := range []struct {
		key string
		dst any
	}{{"dtype", &e.DType}, {"shape", &e.Shape}, {"data_offsets", &offsets}} {
		v, ok := m[f.key]
		if !ok {
			return e, fmt.Errorf("missing key %q", f.key)
		}
		if err := json.Unmarshal(v, f.dst); err != nil {
			return e, fmt.Errorf("%s: %w", f.key, err)
		}
	}
	if e.Shape == nil {
		return e, errors.New("shape is null")
	}
	if len(offsets) != 2 {
		return e, fmt.Errorf("data_offsets has %d values, want 2", len(offsets))
	}
	e.DataOffsets = [2]int{offsets[0], offsets[1]}
	return e, nil
}

// decodeMetadata decodes the __metadata__ object of string values.
func decodeMetadata(msg json.RawMessage) (map[string]string, error) {
	if len(msg) == 0 || msg[0] != '{' {
		return nil, errors.New("not a JSON object")
	}
	m, err := decodeObject(msg)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		if len(v) == 0 || v[0] != '"' {
			return nil, fmt.Errorf("value of %q is not a string", k)
		}
		var str string
		if err := json.Unmarshal(v, &str); err != nil {
			return nil, err
		}
		out[k] = str
	}
	return out, nil
}

// decodeObject splits a JSON object into its members, rejecting duplicate
// keys (encoding/json would silently keep the last) and trailing data
// other than whitespace.
func decodeObject(b []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("object key %v is not a string", tok)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		out[key] = v
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if rest := bytes.TrimRight(b[dec.InputOffset():], " \t\r\n"); len(rest) != 0 {
		return nil, errors.New("trailing data after the header object")
	}
	return out, nil
}

// WriteSafetensors writes tensors (sorted by name, packed in that order)
// and optional metadata in the safetensors format, the header padded with
// spaces to a multiple of 8 bytes. It checks each tensor as
// ReadSafetensors would.
func WriteSafetensors(w io.Writer, tensors map[string]Tensor, metadata map[string]string) error {
	names := slices.Sorted(maps.Keys(tensors))
	var hdr bytes.Buffer
	hdr.WriteByte('{')
	if len(metadata) > 0 {
		m, err := json.Marshal(metadata)
		if err != nil {
			return err
		}
		hdr.WriteString(`"__metadata__":`)
		hdr.Write(m)
	}
	off := 0
	for i, name := range names {
		if name == "__metadata__" {
			return errors.New("models: safetensors: a tensor cannot be named __metadata__")
		}
		t := tensors[name]
		size, ok := dtypeSizes[t.DType]
		if !ok {
			return fmt.Errorf("models: safetensors: tensor %q has unknown dtype %q", name, t.DType)
		}
		count, ok := numel(t.Shape)
		if !ok || count*size != len(t.Data) {
			return fmt.Errorf("models: safetensors: tensor %q: %d bytes for %s%v", name, len(t.Data), t.DType, t.Shape)
		}
		if i > 0 || len(metadata) > 0 {
			hdr.WriteByte(',')
		}
		k, _ := json.Marshal(name)
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		e, _ := json.Marshal(headerEntry{DType: t.DType, Shape: shape, DataOffsets: [2]int{off, off + len(t.Data)}})
		hdr.Write(k)
		hdr.WriteByte(':')
		hdr.Write(e)
		off += len(t.Data)
	}
	hdr.WriteByte('}')
	for hdr.Len()%8 != 0 {
		hdr.WriteByte(' ')
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(hdr.Len()))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(hdr.Bytes()); err != nil {
		return err
	}
	for _, name := range names {
		if _, err := w.Write(tensors[name].Data); err != nil {
			return err
		}
	}
	return nil
}

// State returns copies of the network's parameters and buffers as F32
// tensors keyed by their PyTorch names: the network's state_dict, ready
// for WriteSafetensors. (Batch norm's num_batches_tracked is not kept.)
func (n *Network) State() map[string]Tensor {
	out := make(map[string]Tensor, len(n.segs)+len(n.bufSegs))
	for _, s := range n.segs {
		out[s.Name] = F32Tensor(s.Shape, n.params[s.Offset:s.Offset+s.Len])
	}
	for _, s := range n.bufSegs {
		out[s.Name] = F32Tensor(s.Shape, n.bufs[s.Offset:s.Offset+s.Len])
	}
	return out
}

// LoadState copies parameters and buffers from tensors keyed by PyTorch
// name (a state_dict read with ReadSafetensors). Every parameter and
// buffer must be present as F32 with its exact shape, and no other name
// may appear, except batch norm's *.num_batches_tracked, which is
// ignored. On error nothing is changed.
func (n *Network) LoadState(tensors map[string]Tensor) error {
	type dst struct {
		seg Segment
		buf []float32
	}
	want := make(map[string]dst, len(n.segs)+len(n.bufSegs))
	for _, s := range n.segs {
		want[s.Name] = dst{s, n.params}
	}
	for _, s := range n.bufSegs {
		want[s.Name] = dst{s, n.bufs}
	}
	var errs []error
	vals := make(map[string][]float32, len(want))
	for _, name := range slices.Sorted(maps.Keys(tensors)) {
		t := tensors[name]
		d, ok := want[name]
		if !ok {
			if strings.HasSuffix(name, ".num_batches_tracked") {
				continue
			}
			errs = append(errs, fmt.Errorf("unexpected tensor %q", name))
			continue
		}
		if !slices.Equal(t.Shape, d.seg.Shape) {
			errs = append(errs, fmt.Errorf("%s: shape %v, want %v", name, t.Shape, d.seg.Shape))
			continue
		}
		v, err := t.Float32s()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		vals[name] = v
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, ok := tensors[name]; !ok {
			errs = append(errs, fmt.Errorf("missing tensor %q", name))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("models: %s.LoadState: %w", n.name, errors.Join(errs...))
	}
	for name, v := range vals {
		d := want[name]
		copy(d.buf[d.seg.Offset:d.seg.Offset+d.seg.Len], v)
	}
	return nil
}
