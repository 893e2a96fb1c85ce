package main

import "testing"

func TestParseMemory(t *testing.T) {
	for in, want := range map[string]uint64{"": 0, "2GiB": 2 << 30, "512MiB": 512 << 20, "1.5GB": 1_500_000_000, "4096": 4096, " 3 KiB ": 3072, "10B": 10} {
		got, err := parseMemory(in)
		if err != nil || got != want {
			t.Errorf("parseMemory(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"2 GiBs", "GiB", "-1GiB", "0", "NaN", "1e30TiB", "0.1B"} {
		if got, err := parseMemory(in); err == nil {
			t.Errorf("parseMemory(%q) = %d; want an error", in, got)
		}
	}
}
