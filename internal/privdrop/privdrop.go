// Package privdrop makes a process started as root another user for good: the user's
// supplementary groups, gid and uid, on every thread, then a check that it holds exactly
// those and no capability. The stage worker (becoming the job's user) and the controller
// (becoming controller.user) both go through it.
package privdrop

import (
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Identity is whom to become.
type Identity struct {
	UID, GID uint32
	Groups   []uint32
}

// Lookup is the identity of a user of the user database, with the groups login would give.
func Lookup(name string) (Identity, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return Identity{}, fmt.Errorf("no user %q on this host: %v", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return Identity{}, fmt.Errorf("user %q has a uid or gid that is not a number (%s, %s)", name, u.Uid, u.Gid)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return Identity{}, fmt.Errorf("cannot find the groups of user %q: %v", name, err)
	}
	id := Identity{UID: uint32(uid), GID: uint32(gid), Groups: []uint32{}}
	for _, g := range ids {
		n, err := strconv.ParseUint(g, 10, 32)
		if err != nil {
			return Identity{}, fmt.Errorf("group id %q of user %q is not a number", g, name)
		}
		id.Groups = append(id.Groups, uint32(n))
	}
	return id, nil
}

// Become takes id's groups, gid and uid for every thread of the process (syscall's
// Setgroups, Setresgid and Setresuid change them all), and checks the result.
func Become(id Identity) error {
	groups := make([]int, len(id.Groups))
	for i, g := range id.Groups {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("cannot take the groups of uid %d: %v", id.UID, err)
	}
	if err := syscall.Setresgid(int(id.GID), int(id.GID), int(id.GID)); err != nil {
		return fmt.Errorf("cannot take gid %d: %v", id.GID, err)
	}
	if err := syscall.Setresuid(int(id.UID), int(id.UID), int(id.UID)); err != nil {
		return fmt.Errorf("cannot take uid %d: %v", id.UID, err)
	}
	return Check(id)
}

// Check verifies that the process holds exactly id (its three uids and gids, its groups) and,
// unless id is root, no capability: an agent or controller started with securebits that keep
// capabilities across setuid would leave them.
func Check(id Identity) error {
	if r, e, s := unix.Getresuid(); r != int(id.UID) || e != r || s != r {
		return fmt.Errorf("holds uids %d/%d/%d after taking uid %d", r, e, s, id.UID)
	}
	if r, e, s := unix.Getresgid(); r != int(id.GID) || e != r || s != r {
		return fmt.Errorf("holds gids %d/%d/%d after taking gid %d", r, e, s, id.GID)
	}
	want := make([]int, len(id.Groups))
	for i, g := range id.Groups {
		want[i] = int(g)
	}
	if groups, err := unix.Getgroups(); err != nil || !slices.Equal(slices.Sorted(slices.Values(groups)), slices.Sorted(slices.Values(want))) {
		return fmt.Errorf("holds groups %v after taking %v (%v)", groups, id.Groups, err)
	}
	if id.UID == 0 {
		return nil
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fmt.Errorf("cannot check the process's capabilities: %v", err)
	}
	for _, field := range []string{"CapPrm", "CapEff", "CapAmb"} {
		if v := StatusField(string(status), field); strings.Trim(v, "0") != "" {
			return fmt.Errorf("kept capabilities %s=%s after taking uid %d; "+
				"start it without securebits that keep capabilities (keep-caps, no-setuid-fixup)", field, v, id.UID)
		}
	}
	return nil
}

// StatusField is the value of "Name:\tvalue" in a /proc/<pid>/status text ("" if absent).
func StatusField(status, name string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// UserGroups lists the supplementary groups of uid from the user database, as login would.
func UserGroups(uid uint32) ([]uint32, error) {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return nil, fmt.Errorf("cannot find the groups of uid %d: %v; the storage nodes must know the same users as the login nodes (nsswitch, sssd)", uid, err)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("cannot find the groups of uid %d (%s): %v", uid, u.Username, err)
	}
	list := []uint32{}
	for _, id := range ids {
		n, err := strconv.ParseUint(id, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("group id %q of user %s is not a number", id, u.Username)
		}
		list = append(list, uint32(n))
	}
	return list, nil
}
