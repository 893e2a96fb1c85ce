package data

import (
	"bytes"
	"context"
	"encoding/csv"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseLabelsCSV(t *testing.T) {
	in := "Path,Labels\ntrain/a.png,cat;dog\ntrain/b.png, dog ;cat;dog\n\"test/c,d.png\",\ntest/e.png,bird\n"
	rows, err := ParseLabelsCSV(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []LabelsRow{
		{Path: "train/a.png", Labels: []string{"cat", "dog"}, Line: 2},
		{Path: "train/b.png", Labels: []string{"dog", "cat"}, Line: 3},
		{Path: "test/c,d.png", Labels: []string{}, Line: 4},
		{Path: "test/e.png", Labels: []string{"bird"}, Line: 5},
	}
	if len(rows) != len(want) {
		t.Fatalf("rows = %+v", rows)
	}
	for i := range rows {
		if rows[i].Path != want[i].Path || !slices.Equal(rows[i].Labels, want[i].Labels) || rows[i].Line != want[i].Line {
			t.Errorf("row %d = %+v, want %+v", i, rows[i], want[i])
		}
	}
	for _, c := range []struct{ in, want string }{
		{"", "no rows"},
		{"path,labels\n", "no rows"},
		{"a.png\n", "wrong number of fields"},
		{"a.png,x,y\n", "wrong number of fields"},
		{"/abs.png,x\n", `path "/abs.png"`},
		{"train/../x.png,x\n", `path "train/../x.png"`},
		{"./x.png,x\n", `path "./x.png"`},
		{",x\n", `path ""`},
		{"a.png,x\nb.png,y\na.png,z\n", "line 3: a.png is listed again (first on line 1)"},
		{"a.png,x;;y\n", "line 1: empty label name"},
		{"a.png,\"x\ty\"\n", "control characters"},
		{"a.png,\"x\n", "labels.csv"},
	} {
		_, err := ParseLabelsCSV(strings.NewReader(c.in))
		wantErr(t, err, c.want)
	}
}

func TestOpenLabelsCSV(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "train/x/1.png", encodePNG(t, grayImage(2, 2, 1)))
	writeFile(t, dir, "train/2.png", encodePNG(t, grayImage(2, 2, 2)))
	writeFile(t, dir, "val/3.png", encodePNG(t, grayImage(2, 2, 3)))
	writeFile(t, dir, "test/3.png", encodePNG(t, grayImage(2, 2, 3)))
	writeFile(t, dir, "labels.csv", []byte("train/x/1.png,zebra;ant\ntrain/2.png,\nval/3.png,mole\n"))
	train, test, err := OpenLabelsCSV(context.Background(), dir, ImageFolderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	in := train.Info()
	if in.N != 2 || in.C != 1 || in.H != 2 || in.Classes != 3 || !slices.Equal(in.ClassNames, []string{"ant", "mole", "zebra"}) {
		t.Fatalf("info = %+v", in)
	}
	if !slices.Equal(train.LabelSet(0), []int32{0, 2}) || len(train.LabelSet(1)) != 0 || !slices.Equal(test.LabelSet(0), []int32{1}) {
		t.Errorf("label sets %v %v %v", train.LabelSet(0), train.LabelSet(1), test.LabelSet(0))
	}
	if pix := readAll(t, test, 0); !bytes.Equal(pix, []uint8{3, 4, 5, 6}) {
		t.Errorf("pixels %v", pix)
	}
	var _ MultiSource = train

	bad := func(t *testing.T, csvText string, parts ...string) {
		t.Helper()
		writeFile(t, dir, "labels.csv", []byte(csvText))
		_, _, err := OpenLabelsCSV(context.Background(), dir, ImageFolderOptions{})
		wantErr(t, err, parts...)
	}
	bad(t, "train/x/1.png,a\ntrain/missing.png,a\nval/3.png,b\n", "line 2", filepath.Join(dir, "train", "missing.png"), "does not exist")
	bad(t, "train/x/1.png,a\nother/3.png,b\n", "line 2", "not under train/")
	bad(t, "train/x/1.png,a\n", "0 test rows")
	bad(t, "train/x/1.png,a\ntest/3.png,b\nval/3.png,b\n", "line 3", "one test split")
	bad(t, "train/x/1.png,a\nval/notes.txt,b\n", "line 2", "want a .png")
	bad(t, "train/x/1.png,a;;b\n", "labels.csv", "empty label name")
}

// FuzzParseLabelsCSV checks the parser on arbitrary text: no panic, and
// what it accepts is valid (relative paths listed once, trimmed non-empty
// names without duplicates) and reads back the same after writing it out.
func FuzzParseLabelsCSV(f *testing.F) {
	f.Add("path,labels\ntrain/a.png,cat;dog\ntest/b.jpg,\n")
	f.Add("a.png, x ;y;x\n\"b,c.png\",\"q;r\"\n")
	f.Add("a.png,\"\n\"\n")
	f.Fuzz(func(t *testing.T, in string) {
		rows, err := ParseLabelsCSV(strings.NewReader(in))
		if err != nil {
			return
		}
		seen := map[string]bool{}
		var b bytes.Buffer
		w := csv.NewWriter(&b)
		for _, r := range rows {
			if !fs.ValidPath(r.Path) || r.Path == "." || seen[r.Path] {
				t.Fatalf("accepted path %q", r.Path)
			}
			seen[r.Path] = true
			for i, l := range r.Labels {
				if l == "" || l != strings.TrimSpace(l) || strings.Contains(l, ";") || slices.Contains(r.Labels[:i], l) {
					t.Fatalf("accepted label %q in %q", l, r.Labels)
				}
			}
			if err := w.Write([]string{r.Path, strings.Join(r.Labels, ";")}); err != nil {
				t.Fatal(err)
			}
		}
		w.Flush()
		again, err := ParseLabelsCSV(&b)
		if err != nil {
			t.Fatalf("re-parsing %q: %v", b.String(), err)
		}
		if len(again) != len(rows) {
			t.Fatalf("%d rows, %d after a round trip", len(rows), len(again))
		}
		for i := range rows {
			if again[i].Path != rows[i].Path || !slices.Equal(again[i].Labels, rows[i].Labels) {
				t.Fatalf("row %d: %+v after a round trip, was %+v", i, again[i], rows[i])
			}
		}
	})
}
