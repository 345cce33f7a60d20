package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/user"
	"slices"
	"strconv"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/httpapi"
)

// Handler serves the agent API to the controller. Callers must be root, this agent's own
// user or one of controllerUIDs (the user a controller on this host runs as,
// agent.controller_user) on the Unix socket, or present the shared token over TCP.
func Handler(a agentapi.Agent, token string, controllerUIDs ...uint32) http.Handler {
	mux := http.NewServeMux()
	do := func(w http.ResponseWriter, err error) {
		if err != nil {
			httpapi.WriteError(w, http.StatusInternalServerError, "internal", err.Error())
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, map[string]bool{"ok": true})
	}
	id := func(r *http.Request, name string) int64 {
		v, _ := strconv.ParseInt(r.PathValue(name), 10, 64)
		return v
	}
	mux.HandleFunc("GET /agent/v1/report", func(w http.ResponseWriter, r *http.Request) {
		rep, err := a.Report(r.Context())
		if err != nil {
			do(w, err)
			return
		}
		httpapi.WriteJSON(w, 200, rep)
	})
	mux.HandleFunc("GET /agent/v1/fragments/{id}/usage", func(w http.ResponseWriter, r *http.Request) {
		u, found, err := a.FragmentUsage(r.Context(), id(r, "id"))
		if err != nil {
			do(w, err)
			return
		}
		httpapi.WriteJSON(w, 200, agentapi.FragmentUsageReply{Found: found, Usage: u})
	})
	mux.HandleFunc("PUT /agent/v1/fragments/{id}", func(w http.ResponseWriter, r *http.Request) {
		var spec agentapi.FragmentSpec
		if httpapi.Decode(w, r, &spec) {
			do(w, a.CreateFragment(r.Context(), spec))
		}
	})
	mux.HandleFunc("DELETE /agent/v1/fragments/{id}", func(w http.ResponseWriter, r *http.Request) {
		do(w, a.DeleteFragment(r.Context(), id(r, "id")))
	})
	mux.HandleFunc("PUT /agent/v1/namespaces/{id}", func(w http.ResponseWriter, r *http.Request) {
		var spec agentapi.NamespaceSpec
		if httpapi.Decode(w, r, &spec) {
			do(w, a.CreateNamespace(r.Context(), spec))
		}
	})
	mux.HandleFunc("DELETE /agent/v1/fragments/{fid}/namespaces/{id}", func(w http.ResponseWriter, r *http.Request) {
		do(w, a.DeleteNamespace(r.Context(), id(r, "fid"), id(r, "id")))
	})
	mux.HandleFunc("PUT /agent/v1/mounts/{id}", func(w http.ResponseWriter, r *http.Request) {
		var spec agentapi.MountSpec
		if httpapi.Decode(w, r, &spec) {
			do(w, a.Mount(r.Context(), spec))
		}
	})
	mux.HandleFunc("DELETE /agent/v1/mounts/{id}", func(w http.ResponseWriter, r *http.Request) {
		do(w, a.Unmount(r.Context(), id(r, "id"), r.URL.Query().Get("path")))
	})
	mux.HandleFunc("PUT /agent/v1/stages/{key}", func(w http.ResponseWriter, r *http.Request) {
		var spec agentapi.StageSpec
		if httpapi.Decode(w, r, &spec) {
			do(w, a.StartStage(r.Context(), spec))
		}
	})
	mux.HandleFunc("GET /agent/v1/stages/{key}", func(w http.ResponseWriter, r *http.Request) {
		st, err := a.StageStatus(r.Context(), r.PathValue("key"))
		if err != nil {
			do(w, err)
			return
		}
		httpapi.WriteJSON(w, 200, st)
	})
	mux.HandleFunc("DELETE /agent/v1/stages/{key}", func(w http.ResponseWriter, r *http.Request) {
		st, err := a.CancelStage(r.Context(), r.PathValue("key"))
		if err != nil {
			do(w, err)
			return
		}
		httpapi.WriteJSON(w, 200, st)
	})
	mux.HandleFunc("POST /agent/v1/fragments/{id}/flush", func(w http.ResponseWriter, r *http.Request) {
		var spec agentapi.CacheFlushSpec
		if !httpapi.Decode(w, r, &spec) {
			return
		}
		spec.FragmentID = id(r, "id") // the path names the fragment
		st, err := a.FlushCache(r.Context(), spec)
		if err != nil {
			do(w, err)
			return
		}
		httpapi.WriteJSON(w, 200, st)
	})
	mux.HandleFunc("PUT /agent/v1/swaps/{id}", func(w http.ResponseWriter, r *http.Request) {
		var spec agentapi.SwapSpec
		if httpapi.Decode(w, r, &spec) {
			spec.ID = id(r, "id") // the path names the area
			do(w, a.AttachSwap(r.Context(), spec))
		}
	})
	mux.HandleFunc("POST /agent/v1/swaps/{id}/detach", func(w http.ResponseWriter, r *http.Request) {
		var spec agentapi.SwapDetachSpec
		if !httpapi.Decode(w, r, &spec) {
			return
		}
		spec.ID = id(r, "id")
		st, err := a.DetachSwap(r.Context(), spec)
		if err != nil {
			do(w, err)
			return
		}
		httpapi.WriteJSON(w, 200, st)
	})
	self := uint32(os.Geteuid())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer := httpapi.PeerOf(r)
		allowed := peer.Known && (peer.UID == 0 || peer.UID == self || slices.Contains(controllerUIDs, peer.UID))
		if auth := r.Header.Get("Authorization"); auth != "" {
			allowed = token != "" && auth == "Bearer "+token
		}
		if !allowed {
			httpapi.WriteError(w, http.StatusUnauthorized, "unauthorized", "only the controller may call an agent: root, the agent's user or agent.controller_user on its Unix socket, or the shared token (agent.token_file) over TCP")
			return
		}
		httpapi.Authenticated(w, r) // its connection may hold a reserved slot (controller.reserved_connections)
		mux.ServeHTTP(w, r)
	})
}

// Serve serves the agent API on l until ctx ends (Handler says who may call it).
func Serve(ctx context.Context, l net.Listener, a agentapi.Agent, token string, lim httpapi.Limits, controllerUIDs ...uint32) error {
	err := httpapi.Serve(ctx, l, Handler(a, token, controllerUIDs...), lim)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// ControllerUIDs is the uid of agent.controller_user, when this host knows that user: a
// controller running as it calls the agent on its Unix socket.
func ControllerUIDs(name string) []uint32 {
	if name == "" {
		return nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil
	}
	return []uint32{uint32(uid)}
}
