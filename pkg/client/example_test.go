package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/pkg/client"
)

// A service reads 2,500 posts in one call: the client fetches the
// server's limits once, sends chunks that fit, and returns the records
// in request order.
func ExampleClient_GetPostRecords() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, server.addr, "example", client.WithParallelism(4))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	uris := server.uris[:2500]
	records, err := c.GetPostRecords(ctx, uris)
	if err != nil {
		fmt.Println(err)
		return
	}
	inOrder := true
	for i, r := range records {
		inOrder = inOrder && r.GetUri() == uris[i] && r.GetFound()
	}
	l := c.Limits()
	fmt.Printf("%d records, in order: %v\n", len(records), inOrder)
	fmt.Printf("server limit %d per request; chunks of %d, %d at a time\n", l.MaxItems, l.ChunkSize, l.Parallelism)
	// Output:
	// 2500 records, in order: true
	// server limit 1000 per request; chunks of 1000, 4 at a time
}
