package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/sluice-dev/sluice/internal/app"
	"github.com/sluice-dev/sluice/internal/aturi"
	"github.com/sluice-dev/sluice/internal/guard/fanout"
	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
	"github.com/sluice-dev/sluice/internal/store/cqlstore"
	"github.com/sluice-dev/sluice/internal/synth"
)

func seed(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("seed", flag.ContinueOnError)
	dataDir := fs.String("data-dir", ".data", "directory of the embedded store")
	n := fs.Int("posts", 100_000, "number of posts to write")
	urisOut := fs.String("uris-out", "", "file to write the posts' URIs to, one per line (required)")
	batch := fs.Int("batch", 1000, "posts per store transaction")
	seedVal := fs.Uint64("seed", 1, "random seed; the same seed writes the same posts")
	authors := fs.Int("authors", 5000, "number of distinct authors")
	ifEmpty := fs.Bool("if-empty", false, "do nothing if the store already holds records")
	collection := fs.String("collection", aturi.PostCollection, "collection of the records to write (NSID), e.g. app.bsky.feed.like for bsky.Service/GetLikeRecords")
	parallel := fs.Int("parallel", 32, "writes in flight at once (the CQL store writes one record per statement)")
	cfg := app.DefaultConfig()
	cfg.CQL.RegisterFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *urisOut == "" {
		return fmt.Errorf("seed: --uris-out is required")
	}
	if *n < 1 || *batch < 1 || *parallel < 1 {
		return fmt.Errorf("seed: --posts, --batch and --parallel must be at least 1")
	}
	if _, err := aturi.Parse("at://did:web:example.com/" + *collection + "/self"); err != nil {
		return fmt.Errorf("seed: --collection %q is not an NSID such as app.bsky.feed.like: %w", *collection, err)
	}
	cfg.DataDir = *dataDir
	if err := cfg.CQL.Validate(); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	st, err := app.OpenStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	if *ifEmpty {
		if empty, err := isEmpty(ctx, st); err != nil {
			return err
		} else if !empty {
			fmt.Fprintln(os.Stderr, "seed: store already holds records; nothing to do")
			return nil
		}
	}
	ctx = fanout.WithLimit(ctx, *parallel)
	gen := synth.New(*seedVal, *authors)
	return writePosts(ctx, st, func() store.Record { return gen.NextIn(*collection) }, *n, *batch, *urisOut)
}

// isEmpty asks either backend whether it holds no record.
func isEmpty(ctx context.Context, st store.Store) (bool, error) {
	switch s := st.(type) {
	case *boltstore.Store:
		count, err := s.Count()
		return count == 0, err
	case *cqlstore.Store:
		return s.Empty(ctx)
	}
	return false, fmt.Errorf("seed: --if-empty is not supported by %T", st)
}

// writePosts writes n records made by next (posts unless seed's
// --collection says otherwise) and their URIs.
func writePosts(ctx context.Context, st store.Store, next func() store.Record, n, batch int, urisOut string) error {
	f, err := os.Create(urisOut)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	progress := newProgress(n)
	recs := make([]store.Record, 0, batch)
	for written := 0; written < n; written += len(recs) {
		recs = recs[:0]
		for range min(batch, n-written) {
			recs = append(recs, next())
		}
		if err := st.Put(ctx, recs); err != nil {
			// The URIs of the posts already written still go to the file.
			return errors.Join(fmt.Errorf("seed: after %d posts: %w", written, err), flushURIs(w, urisOut))
		}
		for _, r := range recs {
			fmt.Fprintln(w, r.URI)
		}
		progress.update(written + len(recs))
	}
	progress.done()
	if err := flushURIs(w, urisOut); err != nil {
		return err
	}
	return f.Close()
}

func flushURIs(w *bufio.Writer, urisOut string) error {
	if err := w.Flush(); err != nil {
		return fmt.Errorf("seed: write %s: %w", urisOut, err)
	}
	return nil
}

// progress prints a self-overwriting progress line at most every 200 ms.
type progress struct {
	total int
	start time.Time
	last  time.Time
}

func newProgress(total int) *progress { return &progress{total: total, start: time.Now()} }

func (p *progress) update(done int) {
	if time.Since(p.last) < 200*time.Millisecond && done < p.total {
		return
	}
	p.last = time.Now()
	rate := float64(done) / max(time.Since(p.start).Seconds(), 1e-9)
	fmt.Fprintf(os.Stderr, "\rseed: %d/%d posts (%.0f%%), %.0f posts/s", done, p.total, 100*float64(done)/float64(p.total), rate)
}

func (p *progress) done() {
	fmt.Fprintf(os.Stderr, "\nseed: wrote %d posts in %v\n", p.total, time.Since(p.start).Round(time.Millisecond))
}
