package data

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestReadIDXRoundTrip(t *testing.T) {
	pix := make([]byte, 3*4*5)
	for i := range pix {
		pix[i] = byte(i * 7)
	}
	raw := EncodeIDX([]int{3, 4, 5}, pix)
	for name, in := range map[string][]byte{"raw": raw, "gzip": gz(t, raw)} {
		t.Run(name, func(t *testing.T) {
			img, err := ReadImages(bytes.NewReader(in))
			if err != nil {
				t.Fatal(err)
			}
			if img.N != 3 || img.H != 4 || img.W != 5 || !bytes.Equal(img.Pix, pix) {
				t.Fatalf("got %d×%d×%d %v, want 3×4×5 %v", img.N, img.H, img.W, img.Pix, pix)
			}
		})
	}
	labels := []byte{0, 1, 2, 9, 3}
	for name, in := range map[string][]byte{"raw": EncodeIDX([]int{5}, labels), "gzip": gz(t, EncodeIDX([]int{5}, labels))} {
		t.Run("labels/"+name, func(t *testing.T) {
			got, err := ReadLabels(bytes.NewReader(in))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, labels) {
				t.Fatalf("got %v, want %v", got, labels)
			}
		})
	}
}

// A payload bigger than readN's first chunk exercises its growth.
func TestReadIDXLarge(t *testing.T) {
	pix := make([]byte, 3<<20+17)
	for i := range pix {
		pix[i] = byte(i * 31)
	}
	in := gz(t, EncodeIDX([]int{len(pix)}, pix))
	for _, r := range []io.Reader{bytes.NewReader(in), opaque{bytes.NewReader(in)}} {
		dims, got, err := ReadIDX(r)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(dims, []int{len(pix)}) || !bytes.Equal(got, pix) {
			t.Fatalf("%T: large payload did not round-trip", r)
		}
	}
}

func TestReadIDXErrors(t *testing.T) {
	valid3 := EncodeIDX([]int{2, 2, 2}, make([]byte, 8))
	valid1 := EncodeIDX([]int{4}, []byte{1, 2, 3, 4})
	hdr := func(magic uint32, dims ...uint32) []byte {
		b := binary.BigEndian.AppendUint32(nil, magic)
		for _, d := range dims {
			b = binary.BigEndian.AppendUint32(b, d)
		}
		return b
	}
	badCRC := gz(t, valid1)
	badCRC[len(badCRC)-8] ^= 0xff // CRC-32 in the gzip trailer
	tests := []struct {
		name string
		in   []byte
		read string // "idx", "images", "labels"
		want string
	}{
		{"empty", nil, "idx", "too short"},
		{"one byte", []byte{0}, "idx", "too short"},
		{"short magic", []byte{0, 0, 8}, "idx", "reading magic"},
		{"bad magic", append([]byte{1, 0, 8, 1}, 0, 0, 0, 1, 5), "idx", "bad magic"},
		{"float type", hdr(0x0d01, 1), "idx", "element type 0x0d"},
		{"zero dims", hdr(0x0800), "idx", "0 dimensions"},
		{"too many dims", hdr(0x0805, 1, 1, 1, 1, 1), "idx", "5 dimensions"},
		{"short dims", hdr(0x0803, 1, 1), "idx", "dimension sizes"},
		{"zero size", hdr(0x0801, 0), "idx", "dimension 0 has size 0"},
		{"huge dim", hdr(0x0801, 0xffffffff), "idx", "dimension 0 has size"},
		{"huge product", hdr(0x0803, 60000, 60000, 60000), "idx", "exceed"},
		{"truncated payload", valid3[:len(valid3)-1], "idx", "payload of 8 bytes|need 8 bytes but the input holds at most 7"},
		{"claims more than present", hdr(0x0801, 1<<29), "idx", "payload of 536870912 bytes|need 536870912 bytes but the input holds at most 0"},
		{"trailing data", append(slices.Clone(valid1), 0), "idx", "trailing data after the IDX payload"},
		{"gzip trailing inside", gz(t, append(slices.Clone(valid1), 0)), "idx", "trailing data after the IDX payload"},
		{"gzip trailing outside", append(gz(t, valid1), 7), "idx", "trailing data after the gzip stream"},
		{"gzip truncated", gz(t, valid3)[:20], "idx", "payload"},
		{"gzip bad header", []byte{0x1f, 0x8b, 0, 0}, "idx", "gzip header"},
		{"gzip bad checksum", badCRC, "idx", "checksum"},
		{"labels as images", valid1, "images", "want 3 (N, H, W)"},
		{"images as labels", valid3, "labels", "want 1 (N)"},
	}
	for _, tt := range tests {
		for _, sized := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/sized=%v", tt.name, sized), func(t *testing.T) {
				var r io.Reader = bytes.NewReader(tt.in)
				if !sized {
					r = opaque{r}
				}
				var err error
				switch tt.read {
				case "idx":
					_, _, err = ReadIDX(r)
				case "images":
					_, err = ReadImages(r)
				case "labels":
					_, err = ReadLabels(r)
				}
				if err == nil {
					t.Fatalf("no error, want one containing %q", tt.want)
				}
				if !errors.Is(err, ErrFormat) {
					t.Errorf("error %q does not wrap ErrFormat", err)
				}
				if !slices.ContainsFunc(strings.Split(tt.want, "|"), func(w string) bool { return strings.Contains(err.Error(), w) }) {
					t.Errorf("error %q does not contain %q", err, tt.want)
				}
			})
		}
	}
}

// opaque hides a reader's size (its Len method) from ReadIDX.
type opaque struct{ io.Reader }

// The reader must not allocate what a header claims before the data arrives.
func TestReadIDXClaimDoesNotAllocate(t *testing.T) {
	in := binary.BigEndian.AppendUint32([]byte{0, 0, 8, 1}, 1<<30)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, _, err := ReadIDX(opaque{bytes.NewReader(in)}); err == nil {
		t.Fatal("no error")
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
		t.Fatalf("reading a 12-byte file claiming 1 GiB allocated %d bytes", got)
	}
}

func TestEncodeIDXPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"mismatch": func() { EncodeIDX([]int{2, 2}, make([]byte, 3)) },
		"no dims":  func() { EncodeIDX(nil, nil) },
		"zero dim": func() { EncodeIDX([]int{0}, nil) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil || !strings.HasPrefix(r.(string), "data: EncodeIDX") {
					t.Fatalf("recovered %v, want a data: EncodeIDX panic", r)
				}
			}()
			f()
		})
	}
}

// FuzzReadIDX checks that no input makes the reader panic, and that what it
// accepts is consistent: the payload matches the dimensions and re-encodes
// to the raw input.
func FuzzReadIDX(f *testing.F) {
	f.Add(EncodeIDX([]int{2, 3, 3}, []byte("abcdefghijklmnopqr")))
	f.Add(EncodeIDX([]int{3}, []byte{0, 9, 4}))
	f.Add(gz(f, EncodeIDX([]int{1, 2, 2}, []byte{0, 255, 1, 2})))
	f.Fuzz(func(t *testing.T, in []byte) {
		dims, payload, err := ReadIDX(bytes.NewReader(in))
		// Knowing the input's size may change the message, not the verdict
		// or the result.
		odims, opayload, oerr := ReadIDX(opaque{bytes.NewReader(in)})
		if (err == nil) != (oerr == nil) || !slices.Equal(dims, odims) || !bytes.Equal(payload, opayload) {
			t.Fatalf("sized read: %v %v; unsized read: %v %v", dims, err, odims, oerr)
		}
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %q does not wrap ErrFormat", err)
			}
			return
		}
		total := 1
		for _, d := range dims {
			total *= d
		}
		if total != len(payload) {
			t.Fatalf("dims %v but payload of %d bytes", dims, len(payload))
		}
		enc := EncodeIDX(dims, payload)
		if len(in) >= 2 && in[0] == gzipMagic0 && in[1] == gzipMagic1 {
			return
		}
		if !bytes.Equal(enc, in) {
			t.Fatalf("accepted raw input does not re-encode to itself")
		}
		img, ierr := ReadImages(bytes.NewReader(in))
		if (ierr == nil) != (len(dims) == 3) || (ierr == nil && img.N*img.H*img.W != len(img.Pix)) {
			t.Fatalf("ReadImages on %v: %v", dims, ierr)
		}
		_, lerr := ReadLabels(bytes.NewReader(in))
		if (lerr == nil) != (len(dims) == 1) {
			t.Fatalf("ReadLabels on %v: %v", dims, lerr)
		}
	})
}
