package app

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/api/bsky"
	sluicev1 "github.com/sluice-dev/sluice/api/sluice/v1"
	"github.com/sluice-dev/sluice/internal/bskyrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tests the standard.site reads through the real server, on records
// written through sluice.v1.Records: by URI, the latest version of each
// document and publication asked for, plus each publication a found
// document names in its site field, each once, in request order; other
// collections, missing records and web-address sites are skipped, and
// counted. By ref, only the versions asked for (a rewritten document's
// old cid is no longer answered, its new one is at once), without the
// named publications. A record written without a CID, and a batch over
// the limit, are InvalidArgument.
func TestBskySiteStandard(t *testing.T) {
	ts := startServer(t, 1, func(c *Config) { c.Telemetry.Clients = []string{"appview"} })
	w := sluicev1.NewRecordsClient(ts.conn)
	client := bsky.NewServiceClient(ts.conn)
	ctx := ts.appviewCtx()
	const doc, pub = bskyrpc.DocumentCollection, bskyrpc.PublicationCollection
	pub1, pub2, pub3 := recURI(carol, pub, "3kpub1"), recURI(alice, pub, "3kpub2"), recURI(carol, pub, "3kpub3")
	site := func(uri string) string {
		return fmt.Sprintf(`,"site":%q,"title":"t","publishedAt":"2026-01-01T00:00:00Z"`, uri)
	}
	docs := []*sluicev1.Record{
		writeRec(carol, doc, "3kdoc1", site(pub1)),
		writeRec(carol, doc, "3kdoc2", site("https://blog.example.com")),
		writeRec(carol, doc, "3kdoc3", site(pub2)),
	}
	docs[0].Cid, docs[1].Cid, docs[2].Cid = "bafydoc1", "bafydoc2", "bafydoc3"
	docs[2].TakedownRef = "mod-1"
	pubs := []*sluicev1.Record{writeRec(carol, pub, "3kpub1", ""), writeRec(alice, pub, "3kpub2", ""), writeRec(carol, pub, "3kpub3", "")}
	pubs[0].Cid, pubs[1].Cid, pubs[2].Cid = "bafypub1", "bafypub2", "bafypub3"
	if _, err := w.PutRecords(ctx, &sluicev1.PutRecordsRequest{Records: append(slices.Clone(docs), pubs...)}); err != nil {
		t.Fatal(err)
	}

	byURI, err := client.GetSiteStandardRecordsByURI(ctx, &bsky.GetSiteStandardRecordsByURIRequest{Uris: []string{
		docs[1].Uri, pub3, docs[0].Uri, ts.posts[0].URI, recURI(carol, doc, "3kmissing"), docs[2].Uri, docs[0].Uri, pub1,
	}})
	if err != nil {
		t.Fatal(err)
	}
	checkSiteStandard(t, "by URI: documents", byURI.GetDocuments(), []*sluicev1.Record{docs[1], docs[0], docs[2]})
	checkSiteStandard(t, "by URI: publications", byURI.GetPublications(), []*sluicev1.Record{pubs[2], pubs[0], pubs[1]})
	if d := byURI.GetDocuments(); len(d) == 3 && (!d[2].GetRecord().GetTakenDown() || d[2].GetRecord().GetTakedownRef() != "mod-1" || d[0].GetRecord().GetTakenDown()) {
		t.Errorf("takedowns answered as %v, %v; want only %s taken down, by mod-1", d[0].GetRecord(), d[2].GetRecord(), docs[2].Uri)
	}
	invalid := map[string]string{"client": "appview", "method": "GetSiteStandardRecordsByURI", "source": "invalid"}
	if n := ts.metrics().Sum("sluice_items_total", invalid); n != 1 {
		t.Errorf("sluice_items_total{source=invalid} = %v, want 1 (the post's URI)", n)
	}

	rewritten := writeRec(carol, doc, "3kdoc1", site(pub1)+`,"description":"v2"`)
	rewritten.Cid = "bafydoc1v2"
	if _, err := w.PutRecords(ctx, &sluicev1.PutRecordsRequest{Records: []*sluicev1.Record{rewritten}}); err != nil {
		t.Fatal(err)
	}
	byRef, err := client.GetSiteStandardRecordsByRef(ctx, &bsky.GetSiteStandardRecordsByRefRequest{Refs: []*bsky.RecordRef{
		{Uri: docs[0].Uri, Cid: "bafydoc1"}, {Uri: docs[0].Uri, Cid: "bafydoc1v2"}, {Uri: docs[2].Uri, Cid: "bafydoc3"},
		{Uri: docs[1].Uri, Cid: ""}, {Uri: pub3, Cid: "bafypub3"}, {Uri: pub1, Cid: "bafyother"}, {Uri: ts.posts[0].URI, Cid: ts.posts[0].CID},
	}})
	if err != nil {
		t.Fatal(err)
	}
	checkSiteStandard(t, "by ref: documents", byRef.GetDocuments(), []*sluicev1.Record{rewritten, docs[2]})
	checkSiteStandard(t, "by ref: publications", byRef.GetPublications(), []*sluicev1.Record{pubs[2]})

	// A standard.site record without a CID could never be answered (the
	// AppView keys them by URI and CID): the batch is refused whole.
	noCID := writeRec(carol, doc, "3kdoc4", site(pub1))
	noCID.Cid = ""
	_, err = w.PutRecords(ctx, &sluicev1.PutRecordsRequest{Records: []*sluicev1.Record{writeRec(carol, pub, "3kpub4", ""), noCID}})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "records[1]") || !strings.Contains(st.Message(), "needs a cid") {
		t.Errorf("a document without a cid: %v, want InvalidArgument naming records[1] and the cid", err)
	}
	if got, err := client.GetSiteStandardRecordsByURI(ctx, &bsky.GetSiteStandardRecordsByURIRequest{Uris: []string{recURI(carol, pub, "3kpub4")}}); err != nil || len(got.GetPublications()) != 0 {
		t.Errorf("after the refused batch: %v, %v; want nothing of it written", got, err)
	}

	many := make([]string, 1001)
	for i := range many {
		many[i] = recURI(carol, doc, fmt.Sprintf("3k%d", i))
	}
	_, err = client.GetSiteStandardRecordsByURI(ctx, &bsky.GetSiteStandardRecordsByURIRequest{Uris: many})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "exceeds the limit of 1000") {
		t.Errorf("1001 URIs: %v, want InvalidArgument naming the limit", err)
	}
}

// checkSiteStandard compares answered records with the written ones, in
// order: ref, record bytes and cid.
func checkSiteStandard(t *testing.T, what string, got []*bsky.SiteStandardRecord, want []*sluicev1.Record) {
	t.Helper()
	var gotURIs, wantURIs []string
	for _, g := range got {
		gotURIs = append(gotURIs, g.GetRef().GetUri()+"@"+g.GetRef().GetCid())
	}
	for _, w := range want {
		wantURIs = append(wantURIs, w.Uri+"@"+w.Cid)
	}
	if !slices.Equal(gotURIs, wantURIs) {
		t.Fatalf("%s = %v, want %v", what, gotURIs, wantURIs)
	}
	for i, g := range got {
		if string(g.GetRecord().GetRecord()) != string(want[i].Record) || g.GetRecord().GetCid() != want[i].Cid {
			t.Errorf("%s[%d] = %s (cid %s), want %s", what, i, g.GetRecord().GetRecord(), g.GetRecord().GetCid(), want[i].Record)
		}
	}
}
