package data

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
)

// LabelsRow is one example of a labels.csv file: an image path relative to
// the data set's folder, slash-separated, and its label names (a set,
// possibly empty, in the order first written).
type LabelsRow struct {
	Path   string
	Labels []string
	Line   int // the row's line in the file, for messages
}

// ParseLabelsCSV parses a multi-label index in CSV (RFC 4180, as
// encoding/csv reads it):
//
//	path,labels
//	train/0001.png,cat;dog
//	train/0002.jpg,dog
//	test/0003.png,
//
// Each row has two fields: a relative, slash-separated path without "." or
// ".." elements, and the example's labels separated by ';' (spaces around
// a name are trimmed; an empty field is an example with no label; a name
// given twice counts once). A first row of exactly "path,labels" (or
// "path,label", any case) is a header and skipped. A path listed twice, an
// empty name inside a list ("a;;b"), a name with control characters or a
// row of another width is an error giving the line.
func ParseLabelsCSV(r io.Reader) ([]LabelsRow, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = 2
	var rows []LabelsRow
	seen := map[string]int{}
	for first := true; ; first = false {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("data: labels.csv: %w", err)
		}
		line, _ := cr.FieldPos(0)
		if first && strings.EqualFold(rec[0], "path") && (strings.EqualFold(rec[1], "labels") || strings.EqualFold(rec[1], "label")) {
			continue
		}
		p := rec[0]
		if p == "." || !fs.ValidPath(p) || hasControl(p) {
			return nil, fmt.Errorf("data: labels.csv line %d: path %q: want a relative, slash-separated path without \".\" or \"..\" elements", line, p)
		}
		if prev, ok := seen[p]; ok {
			return nil, fmt.Errorf("data: labels.csv line %d: %s is listed again (first on line %d)", line, p, prev)
		}
		seen[p] = line
		row := LabelsRow{Path: p, Line: line, Labels: []string{}}
		if strings.TrimSpace(rec[1]) != "" {
			for _, l := range strings.Split(rec[1], ";") {
				l = strings.TrimSpace(l)
				if l == "" {
					return nil, fmt.Errorf("data: labels.csv line %d: empty label name in %q (labels are separated by ';')", line, rec[1])
				}
				if hasControl(l) {
					return nil, fmt.Errorf("data: labels.csv line %d: label %q has control characters", line, l)
				}
				if !slices.Contains(row.Labels, l) {
					row.Labels = append(row.Labels, l)
				}
			}
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		return nil, errors.New("data: labels.csv has no rows: want lines of path,label;label;…")
	}
	return rows, nil
}

func hasControl(s string) bool {
	return strings.ContainsFunc(s, unicode.IsControl)
}

// MultiLabelFolder is one split of a multi-label image set indexed by a
// labels.csv, as a [MultiSource]. Immutable and safe for concurrent use.
type MultiLabelFolder struct {
	root  string
	set   imageSet
	sets  [][]int32
	names []string
}

// OpenLabelsCSV opens the multi-label image set described by dir/labels.csv
// (see [ParseLabelsCSV]): rows whose path is under train/ form the
// training split, those under test/ (or val/) the test split, both in file
// order; a path elsewhere, both test/ and val/ in one file, or a split with
// no row is an error. Classes are the sorted label names of the whole file,
// indexed 0, 1, …. Every listed file must exist and have a PNG or JPEG
// extension; images decode as [OpenImageFolder]'s do, with opt.
func OpenLabelsCSV(ctx context.Context, dir string, opt ImageFolderOptions) (train, test *MultiLabelFolder, err error) {
	if err := opt.validate(); err != nil {
		return nil, nil, err
	}
	csvPath := filepath.Join(dir, "labels.csv")
	f, err := os.Open(csvPath)
	if err != nil {
		return nil, nil, fmt.Errorf("data: %w", err)
	}
	rows, err := ParseLabelsCSV(f)
	f.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("%w (in %s)", err, csvPath)
	}
	var names []string
	for _, r := range rows {
		for _, l := range r.Labels {
			if !slices.Contains(names, l) {
				names = append(names, l)
			}
		}
	}
	slices.Sort(names)
	index := make(map[string]int32, len(names))
	for i, n := range names {
		index[n] = int32(i)
	}
	type part struct {
		files []imageFile
		sets  [][]int32
	}
	var tr, te part
	testTop := ""
	for _, r := range rows {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		top, _, _ := strings.Cut(r.Path, "/")
		var s *part
		switch top {
		case "train":
			s = &tr
		case "test", "val":
			if testTop != "" && testTop != top {
				return nil, nil, fmt.Errorf("data: %s line %d: %s is under %s/ but earlier rows are under %s/: use one test split", csvPath, r.Line, r.Path, top, testTop)
			}
			testTop, s = top, &te
		default:
			return nil, nil, fmt.Errorf("data: %s line %d: %s is not under train/, test/ or val/", csvPath, r.Line, r.Path)
		}
		if !slices.Contains(imageExts, strings.ToLower(path.Ext(r.Path))) {
			return nil, nil, fmt.Errorf("data: %s line %d: %s: want a .png, .jpg or .jpeg file", csvPath, r.Line, r.Path)
		}
		p := filepath.Join(dir, filepath.FromSlash(r.Path))
		fi, err := os.Stat(p)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil, fmt.Errorf("data: %s line %d names %s, which does not exist", csvPath, r.Line, p)
			}
			return nil, nil, fmt.Errorf("data: %s line %d: %w", csvPath, r.Line, err)
		}
		if !fi.Mode().IsRegular() {
			return nil, nil, fmt.Errorf("data: %s line %d: %s is not a regular file", csvPath, r.Line, p)
		}
		set := make([]int32, len(r.Labels))
		for i, l := range r.Labels {
			set[i] = index[l]
		}
		slices.Sort(set)
		s.files = append(s.files, imageFile{path: p, size: fi.Size()})
		s.sets = append(s.sets, set)
	}
	if len(tr.files) == 0 || len(te.files) == 0 {
		return nil, nil, fmt.Errorf("data: %s: %d training and %d test rows: want paths under both train/ and test/ (or val/)", csvPath, len(tr.files), len(te.files))
	}
	c, h, w, err := shapeOf(ctx, opt, tr.files, te.files)
	if err != nil {
		return nil, nil, err
	}
	mk := func(name string, s part) *MultiLabelFolder {
		return &MultiLabelFolder{
			root:  dir,
			set:   imageSet{name: name, files: s.files, c: c, h: h, w: w, t: opt.Transform},
			sets:  s.sets,
			names: names,
		}
	}
	return mk(csvPath+" train", tr), mk(csvPath+" "+testTop, te), nil
}

// Info returns the split's size, decoded shape and classes.
func (m *MultiLabelFolder) Info() Info { return m.set.info(len(m.names), m.names) }

// LabelSet returns example i's classes, increasing (see [MultiSource]).
func (m *MultiLabelFolder) LabelSet(i int) []int32 { return m.sets[i] }

// Path returns example i's file.
func (m *MultiLabelFolder) Path(i int) string { return m.set.files[i].path }

// Read decodes example i into dst (see [Pixels]).
func (m *MultiLabelFolder) Read(i int, dst []uint8) error {
	checkRead("MultiLabelFolder", m.Info(), i, dst)
	return m.set.read(i, dst)
}

// Fingerprint identifies the split's file list, file sizes and decoded
// shape, for [CachedChannelStats].
func (m *MultiLabelFolder) Fingerprint() string { return m.set.fingerprint(m.root) }
