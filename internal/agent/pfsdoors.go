package agent

import (
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/privdrop"
)

// pfsDoors are a storage node's doors to the PFS directories its cache instances front, one
// per (directory, user): every access a cache makes to the PFS goes through the door of the
// user it is made for, a worker process holding only that user's credentials (package
// pfsio). A door whose worker died is started again at the next access; at most max run at
// once (pfs.max_workers).
type pfsDoors struct {
	exe  []string // the worker's argv prefix ({exe, "pfs-worker"})
	opts pfsio.Options
	max  int
	// asRoot: this agent is root and starts each worker as its user; otherwise it serves
	// only its own user (a one-machine home), in-process.
	asRoot bool

	mu    sync.Mutex
	doors map[pfsDoorKey]*pfsio.Door
}

type pfsDoorKey struct {
	root string
	uid  uint32
}

func newPFSDoors(exe []string, opts pfsio.Options, max int) *pfsDoors {
	return &pfsDoors{exe: exe, opts: opts, max: max, asRoot: os.Geteuid() == 0, doors: map[pfsDoorKey]*pfsio.Door{}}
}

// door is uid's door to root, started if it has none that is alive. gid is the primary group
// a worker takes when uid is in no user database here (its supplementary groups then are
// none: a site's PFS groups need the users known on its storage nodes, as they do for the PFS
// itself).
func (p *pfsDoors) door(root string, uid, gid uint32) (*pfsio.Door, error) {
	key := pfsDoorKey{root, uid}
	p.mu.Lock()
	defer p.mu.Unlock()
	if d := p.doors[key]; d != nil {
		if d.Alive() {
			return d, nil
		}
		d.Close()
		delete(p.doors, key)
	}
	if len(p.doors) >= p.max {
		return nil, fmt.Errorf("%d PFS workers run on this node already (pfs.max_workers): %w", len(p.doors), syscall.EAGAIN)
	}
	var d *pfsio.Door
	var err error
	switch {
	case uid == uint32(os.Geteuid()):
		// The agent's own user (a one-machine home's, or root's own jobs): in-process.
		d, err = pfsio.Open(root, p.opts)
	case p.asRoot:
		id := identityOf(uid, gid)
		d, err = pfsio.Start(p.exe, root, &id, p.opts)
	default:
		return nil, fmt.Errorf("a PFS access as uid %d: this agent runs as uid %d, not root, and serves only its own user: %w", uid, os.Geteuid(), syscall.EPERM)
	}
	if err != nil {
		return nil, err
	}
	p.doors[key] = d
	return d, nil
}

// closeRoot closes every door to root (its last cache instance on this node ended).
func (p *pfsDoors) closeRoot(root string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, d := range p.doors {
		if k.root == root {
			d.Close()
			delete(p.doors, k)
		}
	}
}

func (p *pfsDoors) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, d := range p.doors {
		d.Close()
		delete(p.doors, k)
	}
}

// identityOf is the job's identity: uid, the job's gid, and the supplementary groups login
// would give uid (only gid when the user database does not know uid).
func identityOf(uid, gid uint32) privdrop.Identity {
	id := privdrop.Identity{UID: uid, GID: gid, Groups: []uint32{gid}}
	if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
		if known, err := privdrop.Lookup(u.Username); err == nil && known.UID == uid {
			for _, g := range known.Groups {
				if !slices.Contains(id.Groups, g) {
					id.Groups = append(id.Groups, g)
				}
			}
		}
	}
	return id
}
