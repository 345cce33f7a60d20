// Package controllerapi holds the controller's REST API wire types: the bodies of requests
// and answers that the controller (package controller) serves and its clients (package
// apiclient, and through it dw_wlm_cli, dwstat and dwcli) send and read. It is apart from
// the controller so that a client links none of the controller: the small dw_wlm_cli binary
// starts several times per job and pays for every package it links (cmd/dw_wlm_cli).
package controllerapi

import (
	"time"

	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/views"
)

// APIError is the body of every error answer.
type APIError = httpapi.Error

// LeaderHeader names the leader's API address in a not_leader answer.
const LeaderHeader = "Spillway-Leader"

// A TCP connection keeps the identity a MUNGE credential proved on it (docs/security.md): a
// request with Authorization: MUNGE <credential> and ConnectionIdentityHeader: bind binds it,
// and the answer says for how many more seconds it holds (ConnectionIdentityHeader: N); later
// requests on that connection claim it with Authorization: MungeConnectionScheme, and carry no
// credential.
const (
	ConnectionIdentityHeader = "Spillway-Connection-Identity"
	MungeConnectionScheme    = "MUNGE-connection"
)

// StagesRequest is the body of data_in and data_out.
type StagesRequest struct {
	Stages []lifecycle.StageRequest `json:"stages"`
}

// PreRunRequest is the body of pre_run.
type PreRunRequest struct {
	Nodes []string `json:"nodes"`
}

// TeardownRequest is the body of teardown.
type TeardownRequest struct {
	Hurry bool `json:"hurry"`
}

// RegistrationUpdate is the body of PATCH /registrations/{id}.
type RegistrationUpdate struct {
	Wait bool `json:"wait"`
}

// NodeUpdate is the body of PATCH /nodes/{name}: the fields given change, the others stay.
type NodeUpdate struct {
	Drain   *bool   `json:"drain,omitempty"`   // take no new fragments (true), or take them again
	Offline *bool   `json:"offline,omitempty"` // hold the node offline (true), or let its heartbeats bring it online
	Pool    *string `json:"pool,omitempty"`    // move the node to this pool (it must hold no fragment)
	// Storage admits the node as a storage node (true): the pool, capacity and data address
	// its heartbeats report count from then on, whatever credential sends them.
	Storage *bool  `json:"storage,omitempty"`
	Reason  string `json:"reason,omitempty"` // why, shown in dwstat nodes --json
}

// PoolCreate is the body of POST /pools.
type PoolCreate struct {
	ID          string `json:"id"`
	Granularity uint64 `json:"granularity"`
}

// LeaseRequest is the body of POST /dw/v1/sessions/{token}/lease.
type LeaseRequest struct {
	Release bool `json:"release,omitempty"` // the run ends, keeping the session on purpose
}

// LeaseReply says how long a lease lasts; 0: leases are off.
type LeaseReply struct {
	Seconds float64 `json:"lease_seconds"`
}

// JobStagesRequest is the body of POST /dw/v1/sessions/{token}/job_stages.
type JobStagesRequest struct {
	Stages []lifecycle.InJobStage `json:"stages"`
}

// JobStagesReply answers a query of a path's stages: DataWarp's counts and the stages.
type JobStagesReply struct {
	Counts lifecycle.InJobCounts     `json:"counts"`
	Stages []lifecycle.StageProgress `json:"stages"`
}

// Created answers POST /dw/v1/sessions/{token}/instances, .../configurations and
// .../activations: the ids of the objects made.
type Created struct {
	IDs []int64 `json:"ids"`
}

// TerminateRequest is the body of POST .../job_stages/terminate.
type TerminateRequest struct {
	Var  string `json:"var"`
	Path string `json:"path"`
}

// ConcurrencyRequest is the body of POST .../job_stages/concurrency, and its answer (the
// limit set, after clamping).
type ConcurrencyRequest struct {
	Concurrency int `json:"concurrency"`
}

// AccountingList is the answer of GET /accounting.
type AccountingList struct {
	Accounting []views.Accounting `json:"accounting"`
	// PendingRecords are torn-down instances' records not yet in controller.accounting_log
	// (it cannot be written: the controller's log says why); shown to administrators only
	// while controller.private_data is on.
	PendingRecords *int `json:"pending_records,omitempty"`
}

// CacheParamsOf is the lifecycle's view of the config's [cache]: the controller applies it at
// setup, and dw_wlm_cli's job_process checks a job's pfs= against it before it is queued.
func CacheParamsOf(c config.Cache) lifecycle.CacheParams {
	return lifecycle.CacheParams{AllowedPFS: c.AllowedPFS, Defaults: model.CacheSettings{
		ModifiedThreshold: uint64(c.ModifiedThreshold), ReadAhead: uint64(c.ReadAhead),
		SyncOnClose: c.SyncOnClose, SyncToPFS: c.SyncToPFS,
		HighWatermark: c.HighWatermark, LowWatermark: c.LowWatermark,
	}}
}

// WriteLimitsOf is the lifecycle's view of the config's [limits]: the controller applies them
// at setup, and dw_wlm_cli's job_process checks a job against them before it is queued.
func WriteLimitsOf(l config.Limits) lifecycle.WriteLimits {
	return lifecycle.WriteLimits{
		WindowLength: int64(l.WriteWindowLength.D() / time.Second), WindowLengthMin: int64(l.WriteWindowLengthMinimum.D() / time.Second),
		Multiplier: l.WriteWindowMultiplier, MultiplierMax: l.WriteWindowMultiplierMaximum,
		FilesCreated: l.FilesCreated, FilesCreatedMax: l.FilesCreatedMaximum,
	}
}

// SwapParamsOf is the lifecycle's view of the config's [swap]: the controller applies it at
// setup and pre_run, and dw_wlm_cli's job_process checks a job's #DW swap against it.
func SwapParamsOf(s config.Swap) lifecycle.SwapParams {
	return lifecycle.SwapParams{MaxPerNode: uint64(s.MaxPerNode), Priority: s.Priority, DetachTimeout: s.DetachTimeout.D()}
}
