// Package munge authenticates users across hosts with MUNGE, as Slurm does: a client asks its
// host's munged for a credential, which names its uid and gid and can be decoded once, by a
// munged with the same key, within its lifetime. Both are asked of munged over its Unix
// socket in its own client protocol (proto.go), as libmunge does: no process per credential,
// and no cgo.
package munge

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// Identity is who a credential was made for.
type Identity struct {
	UID, GID uint32
}

// Encode asks the local munged (at socket; "" = munge's default) for a credential of this
// process's user, with no payload: what `munge -n` prints.
func Encode(ctx context.Context, socket string) (string, error) {
	var v verdict
	var cred string
	err := exchange(ctx, socket, encodeRequest(), msgEncRsp, func(a *answer) { v, cred = encodeAnswer(a) })
	if err == nil && v.code != 0 {
		err = v.err()
	}
	if err != nil {
		return "", fmt.Errorf("cannot get a MUNGE credential: %w (is munged running, with the cluster's key? client.munge_socket names its socket)", err)
	}
	if !strings.HasPrefix(cred, "MUNGE:") {
		return "", unavailable{fmt.Errorf("munged answered no credential: %q", clip(cred))}
	}
	return cred, nil
}

// Decode checks a credential with the local munged and returns whose it is: the uid and gid
// of munged's answer, nothing of the credential's own. A credential that is invalid,
// expired, replayed or made with another key is refused with munge's reason (a *Refusal).
func Decode(ctx context.Context, socket, cred string) (Identity, error) {
	if err := WellFormed(cred); err != nil {
		return Identity{}, err
	}
	var v verdict
	var id Identity
	err := exchange(ctx, socket, decodeRequest(cred), msgDecRsp, func(a *answer) { v, id = decodeAnswer(a) })
	if err == nil && v.code != 0 {
		err = v.err()
	}
	if errors.Is(err, ErrUnavailable) {
		return Identity{}, fmt.Errorf("MUNGE credential not checked: %w", err)
	}
	if err != nil {
		return Identity{}, fmt.Errorf("MUNGE credential refused: %w", err)
	}
	return id, nil
}

// Refusal is munged's verdict against a credential: its munge_err_t code and its reason.
type Refusal struct {
	Code   int
	Reason string
}

func (r *Refusal) Error() string { return r.Reason }

// err is the error of a verdict that is not a success: munged's own failures (its socket,
// its time-out) match ErrUnavailable, anything else is a Refusal.
func (v verdict) err() error {
	msg := v.msg
	if hint := reasons[int(v.code)]; hint != "" {
		// munge's message and ours say the same; ours adds what to check.
		if msg == "" || strings.HasPrefix(strings.ToLower(hint), strings.ToLower(msg)) {
			msg = hint
		} else {
			msg = msg + ": " + hint
		}
	}
	if msg == "" {
		msg = fmt.Sprintf("munge error %d", v.code)
	}
	if v.code == errSocket || v.code == errTimeout {
		return unavailable{errors.New("munged: " + msg)}
	}
	return &Refusal{Code: int(v.code), Reason: msg}
}

// maxCredential bounds what is handed to munged: Spillway's clients send credentials without
// payload, ~150 bytes; 1 KiB leaves room for every cipher and MAC munged offers.
const maxCredential = 1024

// WellFormed checks, without munged, that cred has a MUNGE credential's form: "MUNGE:", a
// base64 body of a plausible length, ":". What fails it costs munged nothing.
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

// ErrUnavailable is what a failure of munged itself matches (errors.Is): not running, not
// answering in time, answering what is not its protocol. The credential was not judged.
var ErrUnavailable = errors.New("munged unavailable")

type unavailable struct{ err error }

func (u unavailable) Error() string   { return u.err.Error() }
func (u unavailable) Unwrap() []error { return []error{u.err, ErrUnavailable} }

// munge_err_t codes of munged's own failures.
const (
	errSocket  = 6
	errTimeout = 7
)

// reasons say more than munged's message for some munge_err_t codes (the numbers unmunge
// exits with too).
var reasons = map[int]string{
	6:  "cannot reach munged (is it running? munge_socket names its socket)",
	7:  "munged timed out",
	8:  "invalid credential",
	11: "invalid credential (made with another key? every host needs the cluster's munge.key)",
	13: "credential from another MUNGE realm",
	14: "invalid credential (made with another key? every host needs the cluster's munge.key)",
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
