// Package munge authenticates users across hosts with MUNGE, as Slurm does: a client asks its
// host's munged for a credential (`munge -n`), which names its uid and gid and can be decoded
// once, by a munged with the same key, within its lifetime (`unmunge`). Debian's munge
// package provides both commands; they are run rather than linked, which keeps the binary
// free of cgo.
package munge

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Identity is who a credential was made for.
type Identity struct {
	UID, GID uint32
}

// Encode asks the local munged (at socket; "" = munge's default) for a credential of this
// process's user, with no payload.
func Encode(ctx context.Context, socket string) (string, error) {
	args := []string{"-n"}
	if socket != "" {
		args = append(args, "-S", socket)
	}
	out, err := run(ctx, "munge", nil, args...)
	if err != nil {
		return "", fmt.Errorf("cannot get a MUNGE credential: %w (is munged running, with the cluster's key? client.munge_socket names its socket)", err)
	}
	cred := strings.TrimSpace(string(out))
	if !strings.HasPrefix(cred, "MUNGE:") {
		return "", fmt.Errorf("munge printed no credential: %q", clip(cred))
	}
	return cred, nil
}

// Decode checks a credential with the local munged and returns whose it is. A credential that
// is invalid, expired, replayed or made with another key is refused with munge's reason.
func Decode(ctx context.Context, socket, cred string) (Identity, error) {
	if err := WellFormed(cred); err != nil {
		return Identity{}, err
	}
	args := []string{"-N", "-k", "UID,GID", "-o", "/dev/null"}
	if socket != "" {
		args = append(args, "-S", socket)
	}
	out, err := run(ctx, "unmunge", []byte(cred), args...)
	if errors.Is(err, ErrUnavailable) {
		return Identity{}, fmt.Errorf("MUNGE credential not checked: %w", err)
	}
	if err != nil {
		return Identity{}, fmt.Errorf("MUNGE credential refused: %w", err)
	}
	var id Identity
	var haveUID, haveGID bool
	for _, line := range strings.Split(string(out), "\n") {
		key, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(value), 10, 32)
		if err != nil {
			continue
		}
		switch strings.TrimSpace(key) {
		case "UID":
			id.UID, haveUID = uint32(n), true
		case "GID":
			id.GID, haveGID = uint32(n), true
		}
	}
	if !haveUID || !haveGID {
		return Identity{}, fmt.Errorf("unmunge printed no UID and GID: %q", clip(string(out)))
	}
	return id, nil
}

// maxCredential bounds what is handed to unmunge: Spillway's clients send credentials without
// payload, ~150 bytes; 1 KiB leaves room for every cipher and MAC munged offers.
const maxCredential = 1024

// WellFormed checks, without munged, that cred has a MUNGE credential's form: "MUNGE:", a
// base64 body of a plausible length, ":". What fails it costs no unmunge process.
func WellFormed(cred string) error {
	body, ok := strings.CutPrefix(cred, "MUNGE:")
	if ok {
		body, ok = strings.CutSuffix(body, ":")
	}
	// (base64's decoder skips line breaks: they are refused here.)
	if !ok || len(cred) > maxCredential || len(body) < minCredentialBody || strings.ContainsAny(body, "\n\r") {
		return errors.New("not a MUNGE credential")
	}
	if _, err := base64.StdEncoding.DecodeString(body); err != nil {
		return errors.New("not a MUNGE credential (its body is not base64)")
	}
	return nil
}

// minCredentialBody is less than any credential munged makes (version, cipher, MAC, realm,
// salt, ids, times and a MAC of at least 16 bytes).
const minCredentialBody = 48

// run runs a munge command, with stdin, and returns its output; a failure carries the
// command's own message.
func run(ctx context.Context, name string, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err == nil {
		return out, nil
	}
	var exit *exec.ExitError
	code := -1
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	}
	msg := strings.TrimSpace(stderr.String())
	switch {
	case msg != "":
		err = errors.New(clip(strings.TrimPrefix(msg, name+": ")))
	case exitReasons[code] != "":
		err = errors.New(exitReasons[code])
	}
	// munged down or stuck, or no munge installed, says nothing about the credential.
	if code == exitSocket || code == exitTimeout || (exit == nil && ctx.Err() == nil) {
		return nil, unavailable{err}
	}
	return nil, err
}

// ErrUnavailable is what a failure of munged itself (not running, timed out) or of running
// munge's commands matches (errors.Is): the credential was not judged.
var ErrUnavailable = errors.New("munged unavailable")

type unavailable struct{ err error }

func (u unavailable) Error() string   { return u.err.Error() }
func (u unavailable) Unwrap() []error { return []error{u.err, ErrUnavailable} }

// munge_err_t codes of munged's own failures.
const (
	exitSocket  = 6
	exitTimeout = 7
)

// exitReasons are munge's exit codes (munge_err_t) that unmunge may end with silently.
var exitReasons = map[int]string{
	6:  "cannot reach munged (is it running? munge_socket names its socket)",
	7:  "munged timed out",
	8:  "invalid credential",
	11: "invalid credential (made with another key? every host needs the cluster's munge.key)",
	13: "credential from another MUNGE realm",
	14: "invalid credential",
	15: "Expired credential (are the hosts' clocks in step?)",
	16: "Rewound credential (are the hosts' clocks in step?)",
	17: "Replayed credential: a MUNGE credential is good for one request",
	18: "Unauthorized credential",
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}
