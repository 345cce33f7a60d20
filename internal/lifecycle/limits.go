package lifecycle

// The site's bounds of DataWarp's write protection (spec §5.3; config [limits]): what a job
// gets when it asks for nothing, and what it may not ask for. Checked at job_process (by
// dw_wlm_cli, before the job is queued) and again at setup.

// WriteLimits are the site's defaults and bounds; a zero field means DataWarp's default
// (WindowLength 86400 s) or no bound.
type WriteLimits struct {
	WindowLength    int64  // seconds, a job's window when it names none; 0: 86400
	WindowLengthMin int64  // seconds, the shortest window a job may ask for; 0: none
	Multiplier      int64  // a job's multiplier when it names none; 0: no write window
	MultiplierMax   int64  // the largest multiplier a job may ask for; 0: none
	FilesCreated    uint64 // a namespace's MFC when the job names none; 0: no limit
	FilesCreatedMax uint64 // the largest MFC a job may ask for; 0: none
}

func (l WriteLimits) windowLength() int64 {
	if l.WindowLength > 0 {
		return l.WindowLength
	}
	return 86400
}

// Check refuses a request past the site's bounds, naming the directive's field and the bound.
func (l WriteLimits) Check(req InstanceRequest) error {
	if l.WindowLengthMin > 0 && req.WriteWindowLength > 0 && req.WriteWindowLength < l.WindowLengthMin {
		return userErr("write_window_length=%d is shorter than this site allows (%d seconds, [limits] write_window_length_minimum); ask for write_window_length=%d or more, or leave it out for the default (%d)",
			req.WriteWindowLength, l.WindowLengthMin, l.WindowLengthMin, l.windowLength())
	}
	if l.MultiplierMax > 0 && req.WriteWindowMultiplier > l.MultiplierMax {
		return userErr("write_window_multiplier=%d is above this site's maximum of %d ([limits] write_window_multiplier_maximum); ask for write_window_multiplier=%d or less",
			req.WriteWindowMultiplier, l.MultiplierMax, l.MultiplierMax)
	}
	if l.FilesCreatedMax > 0 && req.MaxFilesCreated > l.FilesCreatedMax {
		return userErr("access_mode suboption MFC=%d is above this site's maximum of %d files created ([limits] files_created_maximum); ask for MFC=%d or less",
			req.MaxFilesCreated, l.FilesCreatedMax, l.FilesCreatedMax)
	}
	return nil
}

// WriteLimit is what a fragment of capacity bytes may take per window of an instance with
// multiplier (0: no window).
func WriteLimit(multiplier int64, capacity uint64) uint64 {
	if multiplier <= 0 {
		return 0
	}
	if capacity > 0 && uint64(multiplier) > ^uint64(0)/capacity {
		return ^uint64(0)
	}
	return uint64(multiplier) * capacity
}
