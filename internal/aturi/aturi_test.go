package aturi

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

const validDID = "did:plc:ewvi7nxzyoun6zhxrhs64oiz"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		wantErr error
	}{
		{name: "plc post", in: "at://" + validDID + "/app.bsky.feed.post/3k2yihcrp6f2c"},
		{name: "web post", in: "at://did:web:example.com/app.bsky.feed.post/3k2yihcrp6f2c"},
		{name: "web with subdomain", in: "at://did:web:a.b-c.example.com/app.bsky.feed.like/self"},
		{name: "rkey punctuation", in: "at://" + validDID + "/app.bsky.feed.post/a.b_c~d:e-f"},
		{name: "no scheme", in: validDID + "/app.bsky.feed.post/3k2", wantErr: ErrSyntax},
		{name: "http scheme", in: "https://" + validDID + "/app.bsky.feed.post/3k2", wantErr: ErrSyntax},
		{name: "handle authority", in: "at://alice.bsky.social/app.bsky.feed.post/3k2", wantErr: ErrSyntax},
		{name: "short plc", in: "at://did:plc:abc/app.bsky.feed.post/3k2", wantErr: ErrSyntax},
		{name: "upper plc", in: "at://did:plc:EWVI7NXZYOUN6ZHXRHS64OIZ/app.bsky.feed.post/3k2", wantErr: ErrSyntax},
		{name: "other did method", in: "at://did:key:z6Mk/app.bsky.feed.post/3k2", wantErr: ErrSyntax},
		{name: "missing rkey", in: "at://" + validDID + "/app.bsky.feed.post", wantErr: ErrSyntax},
		{name: "empty rkey", in: "at://" + validDID + "/app.bsky.feed.post/", wantErr: ErrSyntax},
		{name: "extra segment", in: "at://" + validDID + "/app.bsky.feed.post/3k2/x", wantErr: ErrSyntax},
		{name: "dot rkey", in: "at://" + validDID + "/app.bsky.feed.post/..", wantErr: ErrSyntax},
		{name: "space in rkey", in: "at://" + validDID + "/app.bsky.feed.post/3k2 x", wantErr: ErrSyntax},
		{name: "crlf injection", in: "at://" + validDID + "/app.bsky.feed.post/3k2\r\nflush_all", wantErr: ErrSyntax},
		{name: "memcached command", in: "get foo\r\n", wantErr: ErrSyntax},
		{name: "query string", in: "at://" + validDID + "/app.bsky.feed.post/3k2?x=1", wantErr: ErrSyntax},
		{name: "bad nsid", in: "at://" + validDID + "/post/3k2", wantErr: ErrSyntax},
		{name: "empty collection", in: "at://" + validDID + "//3k2", wantErr: ErrSyntax},
		{name: "nsid with dash in name", in: "at://" + validDID + "/app.bsky.feed-post/3k2", wantErr: ErrSyntax},
		{name: "too long", in: "at://" + validDID + "/app.bsky.feed.post/" + strings.Repeat("a", MaxLength), wantErr: ErrSyntax},
		{name: "empty", in: "", wantErr: ErrSyntax},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := Parse(tc.in)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("Parse(%q) error = %v, want %v", tc.in, err, tc.wantErr)
			}
			if err == nil && u.String() != tc.in {
				t.Errorf("String() = %q, want %q", u.String(), tc.in)
			}
		})
	}
}

func TestParseIn(t *testing.T) {
	like := "at://" + validDID + "/app.bsky.feed.like/3k2"
	if _, err := ParseIn(like, PostCollection); !errors.Is(err, ErrCollection) {
		t.Fatalf("ParseIn(like, post) = %v, want ErrCollection", err)
	}
	if _, err := ParseIn(like, "app.bsky.feed.like"); err != nil {
		t.Fatalf("ParseIn(like, like) = %v", err)
	}
}

// TestParseInFailsAsParseDoes holds ParseIn, which skips the NSID check
// of a URI in the collection asked for, to Parse followed by the
// collection check: the same URIs accepted, the same first error.
func TestParseInFailsAsParseDoes(t *testing.T) {
	for _, s := range []string{
		"at://" + validDID + "/app.bsky.feed.post/3k2",
		"at://" + validDID + "/app.bsky.feed.like/3k2",
		"at://" + validDID + "/app..post/3k2",
		"at://" + validDID + "/app.bsky.feed.post/bad rkey",
		"at://" + validDID + "/app..post/bad rkey",
		"at://" + validDID + "/app.bsky.feed.like/bad rkey",
		"at://did:plc:short/app.bsky.feed.post/3k2",
		"at://did:plc:short/app..post/3k2",
		"at://" + validDID + "/app.bsky.feed.post",
		"http://" + validDID + "/app.bsky.feed.post/3k2",
		"at://" + validDID + "/app.bsky.feed.post/" + strings.Repeat("k", MaxLength),
	} {
		got, gotErr := ParseIn(s, PostCollection)
		want, wantErr := Parse(s)
		if wantErr == nil && want.Collection != PostCollection {
			want, wantErr = URI{}, fmt.Errorf("%w: collection is %q, want %q", ErrCollection, want.Collection, PostCollection)
		}
		if got != want || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Errorf("ParseIn(%.60q) = %+v, %v; Parse then the collection check: %+v, %v", s, got, gotErr, want, wantErr)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("at://" + validDID + "/app.bsky.feed.post/3k2yihcrp6f2c")
	f.Add("at://did:web:example.com/app.bsky.feed.post/x")
	f.Add("get foo\r\n")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := Parse(s)
		if err != nil {
			return
		}
		if u.String() != s {
			t.Fatalf("round trip: %q became %q", s, u.String())
		}
		for i := 0; i < len(s); i++ {
			if s[i] <= ' ' || s[i] >= 0x7f {
				t.Fatalf("accepted byte %#x at %d in %q", s[i], i, s)
			}
		}
	})
}
