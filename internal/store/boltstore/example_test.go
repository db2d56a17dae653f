package boltstore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/sluice-dev/sluice/internal/store"
	"github.com/sluice-dev/sluice/internal/store/boltstore"
)

func Example() {
	dir, err := os.MkdirTemp("", "boltstore-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	s, err := boltstore.Open(filepath.Join(dir, "sluice.db"), boltstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	uri := "at://did:plc:abc/app.bsky.feed.post/3kexample"
	err = s.Put(ctx, []store.Record{{
		URI:       uri,
		CID:       "bafyreiexample",
		JSON:      []byte(`{"$type":"app.bsky.feed.post","text":"hello"}`),
		CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		IndexedAt: time.Date(2025, 1, 2, 3, 4, 6, 0, time.UTC),
	}})
	if err != nil {
		log.Fatal(err)
	}
	r, err := s.Get(ctx, uri)
	if err != nil {
		log.Fatal(err)
	}
	n, _ := s.Count()
	fmt.Printf("%s %s %d\n", r.CID, r.JSON, n)
	// Output: bafyreiexample {"$type":"app.bsky.feed.post","text":"hello"} 1
}
