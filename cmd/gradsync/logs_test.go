package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
)

func TestSplitWords(t *testing.T) {
	for in, want := range map[string][]string{
		"python3 train.py --epochs 2": {"python3", "train.py", "--epochs", "2"},
		`sh -c 'echo "$RANK" x'`:      {"sh", "-c", `echo "$RANK" x`},
		`a "b c" d\ e "x\"y" ''`:      {"a", "b c", "d e", `x"y`, ""},
		"  lead\ttrail  ":             {"lead", "trail"},
		`py "C:\path" 'it'"'"'s'`:     {"py", `C:\path`, "it's"},
	} {
		got, err := splitWords(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("splitWords(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "   ", `a 'b`, `a "b`, `a\`} {
		if _, err := splitWords(bad); err == nil {
			t.Errorf("splitWords(%q): no error", bad)
		}
	}
}

func TestCopyLog(t *testing.T) {
	var out bytes.Buffer
	p := &printer{out: &out, json: true}
	if err := copyLog(context.Background(), strings.NewReader("one\ntwo\n"), p, "job-1", 1, false); err != nil {
		t.Fatal(err)
	}
	want := `{"event":"log","job_id":"job-1","rank":1,"message":"one"}` + "\n" + `{"event":"log","job_id":"job-1","rank":1,"message":"two"}` + "\n"
	if out.String() != want {
		t.Fatalf("got %q, want %q", out.String(), want)
	}
}
