--[[
Spillway's burst_buffer.lua for Slurm's burst_buffer/lua plugin (Slurm 21.08 and later).

It drives the same Spillway controller as the burst_buffer/datawarp plugin does, through the
same program: every slurm_bb_* function runs `dw_wlm_cli --function ...` (the spillway binary
under that name) and passes its answer back to Slurm.

Install (see docs/slurm.md):
  slurm.conf:          BurstBufferType=burst_buffer/lua
  burst_buffer.conf:   Directive=DW          (so that #DW lines are burst-buffer lines)
  this file:           burst_buffer.lua, next to slurm.conf
  the program:         /usr/local/sbin/dw_wlm_cli (the small binary), or set
                       SPILLWAY_DW_WLM_CLI in slurmctld's environment
  configuration:       /etc/spillway/spillway.toml (or SPILLWAY_CONFIG in slurmctld's
                       environment); SlurmUser listed in controller.wlm_users

Differences from the datawarp plugin, all Slurm's:
  * `#DW jobdw ... capacity=` must name its pool (`pool=wlm_pool`): the lua plugin refuses a
    capacity without a pool.
  * `#BB create_persistent` / `#BB destroy_persistent` are datawarp-plugin features; with the
    lua plugin, create and destroy persistent instances with `spillway persistent` and use
    them with `#DW persistentdw name=...` as usual.

It runs under Lua 5.1 (Debian's Slurm) and 5.3/5.4 (other builds). Slurm passes every
argument as a string. Functions marked "fast" run inside slurmctld with
locks held; they only run dw_wlm_cli calls that answer in milliseconds.
--]]

local lua_script_name = "burst_buffer.lua (spillway)"

-- The program to run, and a bound on its output kept for a reason string.
local dw_wlm_cli = os.getenv("SPILLWAY_DW_WLM_CLI") or "/usr/local/sbin/dw_wlm_cli"
local dwstat = os.getenv("SPILLWAY_DWSTAT") or "/usr/local/sbin/dwstat"
local max_reason = 1024

-- quote makes one shell word of s.
local function quote(s)
	return "'" .. string.gsub(tostring(s), "'", "'\\''") .. "'"
end

-- The shell prints a command's exit status after its output, on a line of its own: Lua 5.1
-- (which Debian's Slurm embeds) does not report the status of an io.popen'ed command.
local status_marker = "spillway_exit_status="  -- no pattern magic characters

-- run executes a program with arguments and returns its exit status and its output
-- (stdout and stderr together, as the datawarp plugin reads them).
local function run(program, args)
	local words = { quote(program) }
	for _, a in ipairs(args) do
		words[#words + 1] = quote(a)
	end
	local cmd = table.concat(words, " ") .. " 2>&1; printf '\\n" .. status_marker .. "%d\\n' $?"
	local p = io.popen(cmd, "r")
	if p == nil then
		return 1, "cannot run " .. program
	end
	local all = p:read("*a") or ""
	p:close()
	local out, code = string.match(all, "^(.*)\n" .. status_marker .. "(%d+)\n$")
	if out == nil then
		return 1, "cannot run " .. program .. ": " .. all
	end
	return tonumber(code), out
end

-- reason shortens an answer for the job's reason field.
local function reason(out)
	out = string.gsub(out, "%s+$", "")
	if #out > max_reason then
		out = string.sub(out, 1, max_reason) .. "..."
	end
	return out
end

-- call runs one dw_wlm_cli function and maps its status onto Slurm's.
local function call(func, args)
	local full = { "--function", func }
	for _, a in ipairs(args) do
		full[#full + 1] = a
	end
	local rc, out = run(dw_wlm_cli, full)
	if rc ~= 0 then
		slurm.log_info("%s: %s failed (%s): %s", lua_script_name, func, tostring(rc), reason(out))
		return slurm.ERROR, reason(out)
	end
	return slurm.SUCCESS, out
end

-- Fast. Validates the job's directives at submission; a failure rejects the job and shows
-- the parser's message (line, field, fix) to the user.
function slurm_bb_job_process(job_script)
	return call("job_process", { "--job", job_script })
end

-- Fast. The pools, in the JSON Slurm expects: {"pools": [{"id", "granularity", "quantity",
-- "free"}]}, integers.
function slurm_bb_pools()
	return call("pools", {})
end

-- Destroys the job's instance after stage-out (or at once with hurry).
function slurm_bb_job_teardown(job_id, job_script, hurry)
	local args = { "--token", job_id, "--job", job_script }
	if hurry == "true" then
		args[#args + 1] = "--hurry"
	end
	return call("teardown", args)
end

-- Creates the job's instance. pool is "(null)" and bb_size 0 for a job without capacity of
-- its own (one that only uses persistent instances).
function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)
	if pool == nil or pool == "(null)" then
		pool = ""
	end
	return call("setup", { "--token", job_id, "--caller", "SLURM", "--user", uid, "--groupid", gid,
		"--capacity", pool .. ":" .. bb_size, "--job", job_script })
end

-- Stages in, as the job's user; returns when done.
function slurm_bb_data_in(job_id, job_script)
	return call("data_in", { "--token", job_id, "--job", job_script })
end

-- The instance's real size in bytes, when larger than asked (rounded up to whole grains).
function slurm_bb_real_size(job_id)
	local rc, out = call("real_size", { "--token", job_id })
	if rc ~= slurm.SUCCESS then
		return rc, out
	end
	local size = string.match(out, '"capacity":%s*(%d+)')
	if size == nil or size == "0" then
		return slurm.SUCCESS
	end
	return slurm.SUCCESS, size
end

-- Fast. Writes the job's variables ($DW_JOB_STRIPED, ...) to path_file.
function slurm_bb_paths(job_id, job_script, path_file)
	return call("paths", { "--token", job_id, "--job", job_script, "--pathfile", path_file })
end

-- The job's compute nodes, expanded from squeue's node list.
local function job_nodes(job_id)
	local rc, list = run("squeue", { "-h", "-j", job_id, "-o", "%N" })
	list = string.gsub(list or "", "%s+", "")
	if rc ~= 0 or list == "" then
		return nil, "cannot find the nodes of job " .. job_id .. ": " .. reason(list)
	end
	local rc2, names = run("scontrol", { "show", "hostnames", list })
	if rc2 ~= 0 then
		return nil, "cannot expand node list " .. list .. ": " .. reason(names)
	end
	local nodes = {}
	for n in string.gmatch(names, "%S+") do
		nodes[#nodes + 1] = n
	end
	return table.concat(nodes, ","), nil
end

-- Mounts the job's instances on its compute nodes.
function slurm_bb_pre_run(job_id, job_script)
	local nodes, err = job_nodes(job_id)
	if nodes == nil then
		slurm.log_info("%s: pre_run %s: %s", lua_script_name, job_id, err)
		return slurm.ERROR, err
	end
	return call("pre_run", { "--token", job_id, "--job", job_script, "--nodes", nodes })
end

-- Unmounts them when the job ends.
function slurm_bb_post_run(job_id, job_script)
	return call("post_run", { "--token", job_id, "--job", job_script })
end

-- Stages out, as the job's user; returns when done.
function slurm_bb_data_out(job_id, job_script)
	return call("data_out", { "--token", job_id, "--job", job_script })
end

-- `scontrol show bbstat [TABLE...]`: dwstat's tables.
function slurm_bb_get_status(...)
	local args = { ... }
	-- Slurm 23.02 and later pass the caller's uid and gid first.
	if #args >= 2 and string.match(args[1], "^%d+$") and string.match(args[2], "^%d+$") then
		table.remove(args, 1)
		table.remove(args, 1)
	end
	local rc, out = run(dwstat, args)
	if rc ~= 0 then
		return slurm.ERROR, reason(out)
	end
	return slurm.SUCCESS, out
end
