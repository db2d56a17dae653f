package bskyrpc

import (
	"context"
	"encoding/json"

	"github.com/sluice-dev/sluice/api/bsky"
	"github.com/sluice-dev/sluice/internal/posts"
	"github.com/sluice-dev/sluice/internal/rpc"
)

// The two collections of standard.site (long-form documents and the
// publications they belong to) that the AppView hydrates external embeds
// from. Both are read by the two GetSiteStandardRecordsBy… methods, which
// answer found records only, split by collection, instead of a list
// aligned with the request.
const (
	DocumentCollection    = "site.standard.document"
	PublicationCollection = "site.standard.publication"
)

// siteStandardMethods are the methods that read the two collections.
var siteStandardMethods = []string{"GetSiteStandardRecordsByURI", "GetSiteStandardRecordsByRef"}

// ref is one record asked for: by URI alone (any stored version), or by
// URI and CID (only that version).
type ref struct{ uri, cid string }

// siteStandardRequest is one request's refs sorted by collection, in
// request order, each once; the rest are counted as invalid.
type siteStandardRequest struct {
	documents, publications []ref
	invalid                 int
}

// sortRefs sorts refs by collection. With exact, a ref must name a
// version: one without a CID matches nothing stored and is invalid.
func sortRefs(refs []ref, exact bool) siteStandardRequest {
	var req siteStandardRequest
	seen := make(map[ref]bool, len(refs))
	for _, r := range refs {
		switch {
		case seen[r]: // asked for again: answered once
		case exact && r.cid == "":
			req.invalid++
		case Readable(r.uri, DocumentCollection):
			req.documents = append(req.documents, r)
		case Readable(r.uri, PublicationCollection):
			req.publications = append(req.publications, r)
		default:
			req.invalid++
		}
		seen[r] = true
	}
	return req
}

// GetSiteStandardRecordsByURI answers the latest version of each
// requested document and publication, and of each publication a found
// document names in its site field (at most once each). URIs of other
// collections are skipped, as are records that do not exist.
func (s *Service) GetSiteStandardRecordsByURI(ctx context.Context, req *bsky.GetSiteStandardRecordsByURIRequest) (*bsky.GetSiteStandardRecordsByURIResponse, error) {
	refs := make([]ref, len(req.GetUris()))
	for i, uri := range req.GetUris() {
		refs[i] = ref{uri: uri}
	}
	docs, pubs, err := s.siteStandard(ctx, "GetSiteStandardRecordsByURI", sortRefs(refs, false), withSites)
	if err != nil {
		return nil, err
	}
	return &bsky.GetSiteStandardRecordsByURIResponse{Documents: docs, Publications: pubs}, nil
}

// GetSiteStandardRecordsByRef answers each requested document and
// publication whose stored version is the one its ref names (sluice keeps
// the latest version of a record only, so a ref to an older one is not
// answered). Publications the documents name are not added.
func (s *Service) GetSiteStandardRecordsByRef(ctx context.Context, req *bsky.GetSiteStandardRecordsByRefRequest) (*bsky.GetSiteStandardRecordsByRefResponse, error) {
	refs := make([]ref, len(req.GetRefs()))
	for i, r := range req.GetRefs() {
		refs[i] = ref{uri: r.GetUri(), cid: r.GetCid()}
	}
	asked := func(pubs []ref, _ []*bsky.SiteStandardRecord) []ref { return pubs }
	docs, pubs, err := s.siteStandard(ctx, "GetSiteStandardRecordsByRef", sortRefs(refs, true), asked)
	if err != nil {
		return nil, err
	}
	return &bsky.GetSiteStandardRecordsByRefResponse{Documents: docs, Publications: pubs}, nil
}

// siteStandard reads want's documents in one batch, then in another the
// publications pubsFor returns from want's and the documents found, and
// counts the request's items.
func (s *Service) siteStandard(ctx context.Context, method string, want siteStandardRequest,
	pubsFor func([]ref, []*bsky.SiteStandardRecord) []ref) (docs, pubs []*bsky.SiteStandardRecord, err error) {
	counts := posts.Counts{Invalid: want.invalid}
	if docs, err = s.readVersions(ctx, DocumentCollection, want.documents, &counts); err != nil {
		return nil, nil, rpc.Status(method, err)
	}
	if pubs, err = s.readVersions(ctx, PublicationCollection, pubsFor(want.publications, docs), &counts); err != nil {
		return nil, nil, rpc.Status(method, err)
	}
	s.recorder.RecordItems(ctx, method, counts)
	return docs, pubs, nil
}

// readVersions reads refs of one collection in one batch and answers
// those found whose version matches (any, for a ref without a cid), in
// order, adding the batch's counts to counts.
func (s *Service) readVersions(ctx context.Context, collection string, refs []ref, counts *posts.Counts) ([]*bsky.SiteStandardRecord, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	uris := make([]string, len(refs))
	for i, r := range refs {
		uris[i] = r.uri
	}
	results, c, err := s.readers[collection].Get(ctx, uris)
	if err != nil {
		return nil, err
	}
	counts.FromCache += c.FromCache
	counts.FromStore += c.FromStore
	counts.NotFound += c.NotFound
	var out []*bsky.SiteStandardRecord
	for i, r := range results {
		if !r.Found || (refs[i].cid != "" && r.Record.CID != refs[i].cid) {
			continue
		}
		out = append(out, &bsky.SiteStandardRecord{
			Ref:    &bsky.RecordRef{Uri: refs[i].uri, Cid: r.Record.CID},
			Record: toRecord(r),
		})
	}
	return out, nil
}

// withSites adds to the requested publications those the documents name
// in their site field (an at:// URI of a publication; a site that is a
// web address names none), each once, after the requested ones.
func withSites(requested []ref, docs []*bsky.SiteStandardRecord) []ref {
	out := requested
	seen := make(map[string]bool, len(requested)+len(docs))
	for _, r := range requested {
		seen[r.uri] = true
	}
	for _, d := range docs {
		site := siteOf(d.GetRecord().GetRecord())
		if seen[site] || !Readable(site, PublicationCollection) {
			continue
		}
		seen[site] = true
		out = append(out, ref{uri: site})
	}
	return out
}

// siteOf returns a site.standard.document record's site field: the
// publication it belongs to (an at:// URI) or its web address; empty when
// the JSON has none.
func siteOf(document []byte) string {
	var d struct {
		Site string `json:"site"`
	}
	if json.Unmarshal(document, &d) != nil {
		return ""
	}
	return d.Site
}
