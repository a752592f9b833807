# What the operations tests (test/ops/*.sh) share, sourced by each: one
# "ok N - what" or "not ok N - what" line per check, and a summary line.

failed=0
n=0

# Runs a command as a check: check WHAT COMMAND [ARG ...].
check() {
	local what=$1
	shift
	n=$((n + 1))
	if "$@"; then
		echo "ok $n - $what"
	else
		echo "not ok $n - $what"
		failed=$((failed + 1))
	fi
}

# Whether two values are equal; says both when not.
eq() { [ "$1" = "$2" ] || { echo "# got '$1', want '$2'" >&2; return 1; }; }

# Ends the test: the summary line, and the exit status.
finish() {
	echo "$((n - failed)) passed, $failed failed"
	[ "$failed" -eq 0 ]
}
