package agent

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/spillway-hpc/spillway/internal/httpapi"
)

// On the Unix socket the agent answers root, its own user and the controller's user
// (agent.controller_user: the packaged controller runs as spillway), and no one else.
func TestAgentAnswersTheControllersUser(t *testing.T) {
	a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: filepath.Join(t.TempDir(), "ssd"), Capacity: 256 * mib})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const controllerUID, otherUID = 4711, 4712
	h := Handler(a, "", controllerUID)
	for uid, want := range map[uint32]int{0: http.StatusOK, controllerUID: http.StatusOK, otherUID: http.StatusUnauthorized} {
		req := httptest.NewRequest("GET", "/agent/v1/report", nil)
		req = req.WithContext(httpapi.WithPeer(req.Context(), httpapi.Peer{UID: uid, GID: uid, Known: true}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("uid %d: %d %s, want %d", uid, rec.Code, rec.Body, want)
		}
	}
	if ControllerUIDs("") != nil || ControllerUIDs("no-such-user-here") != nil {
		t.Error("an empty or unknown agent.controller_user trusted a uid")
	}
}
