package connlimit

import (
	"io"
	"net"
	"testing"
	"time"
)

// Tests that connections over the cap are closed at once and counted,
// and that closing one makes room for the next.
func TestListenerCapsOpenConnections(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(inner, 2)
	defer l.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	first, second := dial(), dial()
	s1, s2 := <-accepted, <-accepted
	_, _ = first, second
	third := dial()
	third.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := third.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a third connection over a cap of 2: read %v, want EOF (closed by the server)", err)
	}
	if st := l.Stats(); st.Open != 2 || st.Refused != 1 || st.Accepted != 2 || st.Peak != 2 {
		t.Errorf("stats %+v", st)
	}
	s1.Close()
	s1.Close()
	dial()
	s3 := <-accepted
	if st := l.Stats(); st.Open != 2 || st.Accepted != 3 {
		t.Errorf("after one closed and another dialed: %+v", st)
	}
	s2.Close()
	s3.Close()
}
