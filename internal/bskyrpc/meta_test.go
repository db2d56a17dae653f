package bskyrpc

import (
	"testing"

	"github.com/sluice-dev/sluice/api/bsky"
	"google.golang.org/protobuf/proto"
)

func TestPostMeta(t *testing.T) {
	for _, tc := range []struct {
		name   string
		record string
		want   *bsky.PostRecordMeta
	}{
		{name: "plain", record: `{"$type":"app.bsky.feed.post","text":"hi"}`, want: &bsky.PostRecordMeta{}},
		{name: "reply", record: `{"$type":"app.bsky.feed.post","reply":{"root":{"uri":"at://x","cid":"c"},"parent":{"uri":"at://x","cid":"c"}}}`, want: &bsky.PostRecordMeta{IsReply: true}},
		{name: "null reply", record: `{"$type":"app.bsky.feed.post","reply":null}`, want: &bsky.PostRecordMeta{}},
		{name: "images", record: `{"embed":{"$type":"app.bsky.embed.images","images":[]}}`, want: &bsky.PostRecordMeta{HasMedia: true}},
		{name: "video", record: `{"embed":{"$type":"app.bsky.embed.video","video":{}}}`, want: &bsky.PostRecordMeta{HasVideo: true}},
		{name: "external link is not media", record: `{"embed":{"$type":"app.bsky.embed.external","external":{"uri":"https://x"}}}`, want: &bsky.PostRecordMeta{}},
		{name: "quote is not media", record: `{"embed":{"$type":"app.bsky.embed.record","record":{"uri":"at://x","cid":"c"}}}`, want: &bsky.PostRecordMeta{}},
		{name: "quote with images", record: `{"embed":{"$type":"app.bsky.embed.recordWithMedia","record":{},"media":{"$type":"app.bsky.embed.images","images":[]}}}`, want: &bsky.PostRecordMeta{HasMedia: true}},
		{name: "quote with video reply", record: `{"reply":{"root":{},"parent":{}},"embed":{"$type":"app.bsky.embed.recordWithMedia","media":{"$type":"app.bsky.embed.video"}}}`, want: &bsky.PostRecordMeta{IsReply: true, HasVideo: true}},
		{name: "missing record", record: ``, want: &bsky.PostRecordMeta{}},
		{name: "not JSON", record: `{"embed":`, want: &bsky.PostRecordMeta{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PostMeta([]byte(tc.record)); !proto.Equal(got, tc.want) {
				t.Errorf("PostMeta(%s) = %v, want %v", tc.record, got, tc.want)
			}
		})
	}
}
