// Package httpapi holds what the controller's and the agents' HTTP APIs share: JSON answers,
// the error shape, strict request decoding, and the peer credentials of Unix-socket callers.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Error is the body of every error answer.
type Error struct {
	Error string `json:"error"`
	Kind  string `json:"kind"` // user, not_found, busy, forbidden, unauthorized, internal
}

// WriteJSON answers with a JSON body.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// WriteError answers with an error body.
func WriteError(w http.ResponseWriter, status int, kind, msg string) {
	WriteJSON(w, status, Error{Error: msg, Kind: kind})
}

// Decode reads a JSON body strictly (unknown fields are errors); an empty body leaves into
// unchanged. On failure it has already answered.
func Decode(w http.ResponseWriter, r *http.Request, into any) bool {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		WriteError(w, http.StatusRequestEntityTooLarge, "user", "request body: "+err.Error())
		return false
	}
	if len(body) == 0 {
		return true
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		WriteError(w, http.StatusBadRequest, "user", "request body: "+err.Error())
		return false
	}
	return true
}

// Peer is who is on the other end of a connection.
type Peer struct {
	UID   uint32
	GID   uint32 // the peer's group when it connected
	Known bool   // read from a Unix socket's SO_PEERCRED
}

type peerKey struct{}

// ConnContext records the peer's uid for Unix-socket connections.
func ConnContext(ctx context.Context, conn net.Conn) context.Context {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return ctx
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil || cred == nil {
		return ctx
	}
	return context.WithValue(ctx, peerKey{}, Peer{UID: cred.Uid, GID: cred.Gid, Known: true})
}

// PeerOf returns the request's peer.
func PeerOf(r *http.Request) Peer {
	p, _ := r.Context().Value(peerKey{}).(Peer)
	return p
}

// Serve serves h on l until ctx ends.
func Serve(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ConnContext: ConnContext, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	err := srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Listen opens "unix:/path" (replacing a stale socket, refusing a live one) or "host:port".
// Unix sockets are made mode 0666: authorization is per request, from the peer's uid.
func Listen(address string) (net.Listener, error) {
	if !strings.HasPrefix(address, "unix:") && !strings.HasPrefix(address, "/") {
		return net.Listen("tcp", strings.TrimPrefix(address, "tcp:"))
	}
	path := strings.TrimPrefix(address, "unix:")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
		conn.Close()
		return nil, fmt.Errorf("another process is already listening on %s", path)
	}
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	os.Chmod(path, 0o666)
	return l, nil
}
