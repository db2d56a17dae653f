package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-dev/sluice/internal/loadgen/report"
)

// Tests that a run whose clients ran in two load-generator processes
// reads as one report: every client of both, the first's vital signs,
// the longer length.
func TestReadJoinedMergesTheProcessesOfOneRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, r report.Report) string {
		path := filepath.Join(dir, name)
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	normal := write("normal.json", report.Report{ElapsedSeconds: 20.1, Vitals: &report.Vitals{},
		Clients: []report.Client{{Name: "feed", Items: 10}, {Name: "search", Items: 5}}})
	bulk := write("bulk.json", report.Report{ElapsedSeconds: 20.4,
		Clients: []report.Client{{Name: "heavy-1", Items: 1000}}})

	r, err := readJoined(normal + "+" + bulk)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Clients) != 3 || r.Client("feed") == nil || r.Client("heavy-1").Items != 1000 {
		t.Fatalf("clients %+v, want feed, search and heavy-1", r.Clients)
	}
	if r.Vitals == nil || r.ElapsedSeconds != 20.4 {
		t.Fatalf("vitals %v, elapsed %v: want the first's vitals and the longer run", r.Vitals, r.ElapsedSeconds)
	}
	if one, err := readJoined(normal); err != nil || len(one.Clients) != 2 {
		t.Fatalf("one report: %v clients, %v", len(one.Clients), err)
	}
}
