package posts

import (
	"fmt"
	"strconv"
)

// InvalidURIError reports the first URI of a batch that is not a record
// AT-URI of the served collection.
type InvalidURIError struct {
	Index int
	URI   string
	Err   error
}

func (e *InvalidURIError) Error() string {
	return fmt.Sprintf("uris[%d] %s is not a valid AT-URI: %v", e.Index, quote(e.URI), e.Err)
}

func (e *InvalidURIError) Unwrap() error { return e.Err }

// InvalidRecordError reports the first record of a write that cannot be
// stored; nothing of the batch is written.
type InvalidRecordError struct {
	Index  int
	URI    string
	Reason string
}

func (e *InvalidRecordError) Error() string {
	return fmt.Sprintf("records[%d] (%s): %s", e.Index, quote(e.URI), e.Reason)
}

// quote shows a caller's string safely: escaped and cut short.
func quote(s string) string {
	if len(s) > 96 {
		s = s[:96] + "..."
	}
	return strconv.Quote(s)
}
