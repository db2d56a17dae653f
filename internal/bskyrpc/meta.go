package bskyrpc

import (
	"bytes"
	"encoding/json"

	"github.com/sluice-dev/sluice/api/bsky"
)

// Embed types that count as media (images) and as video, directly or as
// the media of a recordWithMedia embed. External links and quoted records
// are neither, matching the AppView's "posts with media" and "posts with
// video" author feeds.
const (
	embedImages          = "app.bsky.embed.images"
	embedVideo           = "app.bsky.embed.video"
	embedRecordWithMedia = "app.bsky.embed.recordWithMedia"
)

// postShape is the part of an app.bsky.feed.post record meta depends on.
type postShape struct {
	Reply json.RawMessage `json:"reply"`
	Embed *embedShape     `json:"embed"`
}

type embedShape struct {
	Type  string      `json:"$type"`
	Media *embedShape `json:"media"`
}

// PostMeta derives a post's meta from its JSON: is_reply when it has a
// reply reference, has_media for an image embed and has_video for a video
// embed (each also inside recordWithMedia). The gate fields are not in
// the JSON: GetPostRecords copies them from the stored gate state. Empty or undecodable
// JSON gives an all-false meta, as for a post that does not exist.
func PostMeta(record []byte) *bsky.PostRecordMeta {
	var p postShape
	if len(record) == 0 || json.Unmarshal(record, &p) != nil {
		return &bsky.PostRecordMeta{}
	}
	media := p.Embed
	if media != nil && media.Type == embedRecordWithMedia {
		media = media.Media
	}
	var mediaType string
	if media != nil {
		mediaType = media.Type
	}
	return &bsky.PostRecordMeta{
		IsReply:  len(p.Reply) > 0 && !bytes.Equal(p.Reply, []byte("null")),
		HasMedia: mediaType == embedImages,
		HasVideo: mediaType == embedVideo,
	}
}
