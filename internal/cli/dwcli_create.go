package cli

import (
	"context"
	"fmt"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/units"
	"github.com/spillway-hpc/spillway/internal/views"
)

// dwcli create session|instance|configuration|activation: DataWarp's manual walk-through,
// an instance built object by object.

// createOpts are the options of those commands, as given.
type createOpts struct {
	token, owner, creator, hosts, expiration, group string
	persistent                                      bool
	session, instance, configuration                int64
	capacity, pool, label, optimization             string
	typ, accessMode, rootPermissions, backingPath   string
	mount                                           string
}

// createOptions are the options each create command takes (besides the connection's and --json).
var createOptions = map[string][]string{
	"create sessions":       {"token", "owner", "creator", "hosts", "expiration", "group", "persistent"},
	"create instances":      {"session", "capacity", "pool", "label", "optimization"},
	"create configurations": {"instance", "type", "access-mode", "root-permissions", "group", "backing-path"},
	"create activations":    {"session", "configuration", "mount"},
}

// parseUID takes a uid or a user name; parseGID a gid or a group name.
func parseUID(s string) (uint32, string, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		u, _ := user.LookupId(s)
		gid := ""
		if u != nil {
			gid = u.Gid
		}
		return uint32(n), gid, nil
	}
	u, err := user.Lookup(s)
	if err != nil {
		return 0, "", fmt.Errorf("--owner %s: no such user; give a uid or a user name", s)
	}
	n, _ := strconv.ParseUint(u.Uid, 10, 32)
	return uint32(n), u.Gid, nil
}

func parseGID(s string) (uint32, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return uint32(n), nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return 0, fmt.Errorf("--group %s: no such group; give a gid or a group name", s)
	}
	n, _ := strconv.ParseUint(g.Gid, 10, 32)
	return uint32(n), nil
}

// checkCreate checks a create command's options before connecting; it returns the request
// to send (lifecycle.Setup or lifecycle.Manual*) or a mistake.
func (o *createOpts) check(command string, set map[string]bool) (any, string) {
	switch command {
	case "create sessions":
		if o.token == "" || o.owner == "" {
			return nil, "create session needs --token TOKEN and --owner UID"
		}
		uid, gid, err := parseUID(o.owner)
		if err != nil {
			return nil, err.Error()
		}
		req := lifecycle.Setup{Token: o.token, Creator: o.creator, Owner: uid, Persistent: o.persistent, Manual: true}
		if req.Creator == "" {
			req.Creator = "CLI"
		}
		switch {
		case set["group"]:
			g, err := parseGID(o.group)
			if err != nil {
				return nil, err.Error()
			}
			req.Group = g
		case gid != "":
			g, _ := strconv.ParseUint(gid, 10, 32)
			req.Group = uint32(g)
		default:
			return nil, fmt.Sprintf("--owner %s has no entry in the user database here: give its group too (--group GID)", o.owner)
		}
		for _, h := range strings.Split(o.hosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				req.ClientNodes = append(req.ClientNodes, h)
			}
		}
		if req.Expiration, err = parseExpiration(o.expiration, time.Now()); err != nil {
			return nil, err.Error()
		}
		return req, ""
	case "create instances":
		if o.session <= 0 || o.capacity == "" {
			return nil, "create instance needs --session ID and --capacity SIZE (and --pool POOL unless the default pool)"
		}
		c, err := units.ParseSize(o.capacity)
		if err != nil || c == 0 {
			return nil, fmt.Sprintf("--capacity %q: give a size greater than 0, e.g. 200GiB or 1TB", o.capacity)
		}
		return lifecycle.ManualInstance{Capacity: c, Pool: o.pool, Label: o.label, Strategy: o.optimization}, ""
	case "create configurations":
		if o.instance <= 0 || o.accessMode == "" {
			return nil, "create configuration needs --instance ID and --access-mode stripe|private|ldbal"
		}
		req := lifecycle.ManualConfiguration{Instance: o.instance, Type: o.typ, AccessMode: o.accessMode, BackingPath: o.backingPath}
		if set["root-permissions"] {
			p, err := strconv.ParseUint(o.rootPermissions, 8, 32)
			if err != nil || p > 0o7777 {
				return nil, fmt.Sprintf("--root-permissions %q: give octal permission bits, at most 7777, e.g. 0755 or 2770", o.rootPermissions)
			}
			perm := uint32(p)
			req.RootPermissions = &perm
		}
		if set["group"] {
			g, err := parseGID(o.group)
			if err != nil {
				return nil, err.Error()
			}
			req.Group = &g
		}
		return req, ""
	case "create activations":
		if o.session <= 0 || o.configuration <= 0 || o.mount == "" {
			return nil, "create activation needs --session ID, --configuration ID and --mount PATH"
		}
		return lifecycle.ManualActivation{Configuration: o.configuration, Mount: o.mount}, ""
	}
	return nil, ""
}

// create sends a checked request; it returns the new objects' ids.
func (o *createOpts) create(ctx context.Context, sess *Session, command string, req any) ([]int64, error) {
	all, err := sess.client.All(ctx)
	if err != nil {
		return nil, err
	}
	tokenOf := func(id int64) (string, error) {
		for _, s := range all.Sessions {
			if s.ID == id {
				return s.Token, nil
			}
		}
		return "", fmt.Errorf("no session with id %d (dwstat sessions lists them)", id)
	}
	switch command {
	case "create sessions":
		setup := req.(lifecycle.Setup)
		for _, s := range all.Sessions {
			if s.Token == setup.Token {
				return nil, fmt.Errorf("token %s is session %d's already; give another --token", setup.Token, s.ID)
			}
		}
		if err := sess.client.Setup(ctx, setup); err != nil {
			return nil, err
		}
		if all, err = sess.client.All(ctx); err != nil {
			return nil, err
		}
		for _, s := range all.Sessions {
			if s.Token == setup.Token {
				return []int64{s.ID}, nil
			}
		}
		return nil, fmt.Errorf("session %s was created but is not listed", setup.Token)
	case "create instances":
		r := req.(lifecycle.ManualInstance)
		if r.Pool == "" {
			r.Pool = sess.cfg.Controller.DefaultPool
		}
		token, err := tokenOf(o.session)
		if err != nil {
			return nil, err
		}
		return sess.client.CreateObject(ctx, token, "instances", r)
	case "create configurations":
		var inst *views.Instance
		for i := range all.Instances {
			if all.Instances[i].ID == o.instance {
				inst = &all.Instances[i]
			}
		}
		if inst == nil {
			return nil, fmt.Errorf("no instance with id %d (dwstat instances lists them)", o.instance)
		}
		token, err := tokenOf(inst.Links.Session)
		if err != nil {
			return nil, err
		}
		return sess.client.CreateObject(ctx, token, "configurations", req)
	case "create activations":
		token, err := tokenOf(o.session)
		if err != nil {
			return nil, err
		}
		return sess.client.CreateObject(ctx, token, "activations", req)
	}
	return nil, fmt.Errorf("%s is not a command", command)
}
