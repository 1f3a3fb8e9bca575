package transport

import (
	"net"
	"testing"
	"time"
)

// TestPeekReadable: the peek mesh.wait uses before sleeping sees unread
// bytes without consuming them, and sees none on an idle connection.
func TestPeekReadable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed := make(chan net.Conn, 1)
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Error(err)
		}
		dialed <- c
	}()
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli := <-dialed
	defer cli.Close()
	rc, err := srv.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if peekReadable(rc) {
		t.Fatal("idle connection reported readable")
	}
	if _, err := cli.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !peekReadable(rc) {
		if time.Now().After(deadline) {
			t.Fatal("written bytes never reported readable")
		}
		time.Sleep(time.Millisecond)
	}
	if !peekReadable(rc) {
		t.Fatal("peeking consumed the bytes")
	}
	b := make([]byte, 5)
	if _, err := srv.Read(b); err != nil || string(b) != "hello" {
		t.Fatalf("read after peeks: %q, %v", b, err)
	}
	if peekReadable(rc) {
		t.Fatal("readable after everything was read")
	}
}
