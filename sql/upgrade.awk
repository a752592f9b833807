# Builds an upgrade script (ALTER EXTENSION pg_outbox UPDATE) from its
# sources, the way PgQ builds its upgrade: the schema changes are written
# by hand, the functions are taken from the install parts. make runs
#
#   awk -f sql/upgrade.awk sql/released/pg_outbox--A.sql sql/upgrade/A--B.sql sql/install/*.sql
#
# and gets sql/pg_outbox--A--B.sql:
#
# - the hand part sql/upgrade/A--B.sql down to its line "-- @functions@":
#   what must happen before the functions are defined (new tables and
#   columns, data moved, DROP FUNCTION of each function whose result,
#   argument names, defaults or language rules forbid CREATE OR REPLACE,
#   DROP VIEW of a view over one of them);
# - then every function of the install parts, in their order, with the
#   statements that belong to a function: COMMENT ON FUNCTION, GRANT and
#   REVOKE ... ON FUNCTION, ALTER FUNCTION. Each function is created with
#   CREATE OR REPLACE when A has it (its COMMENT ON FUNCTION names the same
#   signature in A's install script, sql/released/pg_outbox--A.sql) and the
#   hand part does not drop it, with CREATE otherwise: an update replaces
#   only its own functions, and a function of that name that someone else
#   made fails the update instead of being taken over;
# - then the rest of the hand part: what needs the new functions (views
#   over them, triggers, indexes and constraints that call them, calls).
#
# A function is known by its COMMENT ON FUNCTION (every function has one,
# STYLE.md), which must follow its CREATE FUNCTION before the next one: it
# names the signature as PostgreSQL identifies the function.
#
# The generator fails (and make with it) when the hand part has no line
# "-- @functions@" or more than one; when it creates or comments a
# function that the install parts define (the generator provides it); when
# it drops (without IF EXISTS) a function that A does not have under that
# signature; when a function of A is neither in the install parts nor
# dropped (it would stay behind); when a function has no COMMENT ON
# FUNCTION; or when a statement does not end at a line's end (statements
# are split by a small lexer that knows SQL's strings, quoted identifiers,
# dollar quotes and comments, and keep their text as written). POSIX awk:
# mawk and gawk run it.

BEGIN {
	nfile = 0
	failed = 0
}

function fail(msg) {
	printf "%s:%d: %s\n", FILENAME, FNR, msg > "/dev/stderr"
	failed = 1
	exit 1
}

# Lexes one line from the state left by the line before (st: "" outside
# any quote, "'" in a string, "e" in an E'' string, "\"" in a quoted
# identifier, "$" in a dollar quote with tag dtag, "*" in a block comment
# of depth cdepth). Sets lcode to the line's code (comments left out,
# string and body contents blanked), lend to 1 when a statement ends on
# it (at a ";" outside quotes and comments), and fails when code follows
# that ";" on the line.
function lex(line,    i, n, c, c2, rest) {
	lcode = ""
	lend = 0
	n = length(line)
	i = 1
	while (i <= n) {
		c = substr(line, i, 1)
		c2 = substr(line, i, 2)
		if (st == "*") {
			if (c2 == "*/") {
				cdepth--
				i += 2
				if (cdepth == 0) {
					st = ""
					lcode = lcode " "
				}
				continue
			}
			if (c2 == "/*") {
				cdepth++
				i += 2
				continue
			}
			i++
			continue
		}
		if (st == "'") {
			if (c2 == "''") {
				i += 2
				continue
			}
			if (c == "'") {
				st = ""
				lcode = lcode "'"
			}
			i++
			continue
		}
		if (st == "e") {
			if (c == "\\") {
				i += 2
				continue
			}
			if (c2 == "''") {
				i += 2
				continue
			}
			if (c == "'") {
				st = ""
				lcode = lcode "'"
			}
			i++
			continue
		}
		if (st == "\"") {
			lcode = lcode c
			if (c2 == "\"\"") {
				lcode = lcode c
				i += 2
				continue
			}
			if (c == "\"")
				st = ""
			i++
			continue
		}
		if (st == "$") {
			if (substr(line, i, length(dtag)) == dtag) {
				st = ""
				lcode = lcode dtag
				i += length(dtag)
				continue
			}
			i++
			continue
		}
		# Outside quotes and comments.
		if (lend) {
			if (c2 == "--")
				break
			if (c == " " || c == "\t" || c == "\r") {
				i++
				continue
			}
			if (c2 == "/*") {
				st = "*"
				cdepth = 1
				i += 2
				continue
			}
			fail("a statement must end at the end of its line")
		}
		if (c2 == "--")
			break
		if (c2 == "/*") {
			st = "*"
			cdepth = 1
			i += 2
			continue
		}
		if (c == "'") {
			# E'...' (backslash escapes) when E or e stands alone before it.
			if (i > 1 && substr(line, i - 1, 1) ~ /[Ee]/ && (i == 2 || substr(line, i - 2, 1) !~ /[A-Za-z0-9_$]/))
				st = "e"
			else
				st = "'"
			lcode = lcode "'"
			i++
			continue
		}
		if (c == "\"") {
			st = "\""
			lcode = lcode c
			i++
			continue
		}
		if (c == "$") {
			rest = substr(line, i)
			if ((i == 1 || substr(line, i - 1, 1) !~ /[A-Za-z0-9_]/) && match(rest, /^\$([A-Za-z_][A-Za-z0-9_]*)?\$/)) {
				dtag = substr(rest, 1, RLENGTH)
				st = "$"
				lcode = lcode dtag
				i += RLENGTH
				continue
			}
		}
		if (c == ";") {
			lend = 1
			lcode = lcode ";"
			i++
			continue
		}
		lcode = lcode c
		i++
	}
}

# The code of a statement in upper case, on one line, single spaces.
function squash(s) {
	s = toupper(s)
	gsub(/[ \t\r\n]+/, " ", s)
	sub(/^ /, "", s)
	return s
}

# The signature "name(type,type)" at the start of s (a function named in
# a COMMENT ON or DROP FUNCTION), lower case and without spaces; sets
# sigend to the length of s it took. A name without arguments is the
# name alone.
function signature(s,    i, n, c, depth, out) {
	n = length(s)
	depth = 0
	out = ""
	for (i = 1; i <= n; i++) {
		c = substr(s, i, 1)
		if (c == "(")
			depth++
		else if (c == ")") {
			depth--
			if (depth == 0) {
				out = out c
				break
			}
		} else if (depth == 0 && (c == "," || c == ";" || (c == " " && out != "" && substr(s, i + 1, 1) != "(")))
			break
		out = out c
	}
	sigend = i
	out = tolower(out)
	gsub(/[ \t]/, "", out)
	return out
}

function sig_name(sig) {
	sub(/\(.*/, "", sig)
	return sig
}

# The name of the function a CREATE FUNCTION statement (squashed code)
# creates, lower case.
function created_name(code,    rest) {
	rest = code
	sub(/^CREATE (OR REPLACE )?(FUNCTION|PROCEDURE) /, "", rest)
	sub(/ ?\(.*/, "", rest)
	return tolower(rest)
}

# What a statement of the install parts is, from its squashed code:
# "create", "comment", "other" (privileges or ALTER of a function), or ""
# (the structure the hand part takes care of).
function kind(code) {
	if (code ~ /^CREATE (OR REPLACE )?(FUNCTION|PROCEDURE) /)
		return "create"
	if (code ~ /^COMMENT ON (FUNCTION|PROCEDURE) /)
		return "comment"
	if (code ~ /^ALTER (FUNCTION|PROCEDURE|ROUTINE) /)
		return "other"
	if (code ~ /^(GRANT|REVOKE) / && code ~ / ON (FUNCTION|PROCEDURE|ROUTINE|ALL FUNCTIONS|ALL PROCEDURES|ALL ROUTINES) /)
		return "other"
	return ""
}

function comment_sig(code) {
	sub(/^COMMENT ON (FUNCTION|PROCEDURE) /, "", code)
	return signature(code)
}

# Output of the generated part: statements wait while a function waits
# for its COMMENT ON FUNCTION (which decides CREATE or CREATE OR REPLACE).
function emit(text) {
	if (held != "")
		held = held text
	else
		printf "%s", text
}

# A statement of the install parts: lines, their code, the comment lines
# before it.
function install_statement(lines, code, lead,    k, sig, name, verb, n, i, arr, out, done, head) {
	k = kind(code)
	if (k == "")
		return
	if (k == "create") {
		if (held != "")
			fail("function " held_name " has no COMMENT ON FUNCTION before the next function")
		held_name = created_name(code)
		if (held_name in hand_created)
			fail("the hand part " hand_file " creates function " held_name ": the generator takes it from here")
		held = "\n" lead lines
		return
	}
	if (k == "comment") {
		sig = comment_sig(code)
		name = sig_name(sig)
		install_sig[sig] = 1
		if (name in hand_commented)
			fail("the hand part " hand_file " comments function " name ": the generator takes the comment from here")
		if (held != "" && name == held_name) {
			verb = ((sig in old_sig) && !(sig in dropped) && !(name in dropped)) ? "CREATE OR REPLACE FUNCTION" : "CREATE FUNCTION"
			n = split(held, arr, "\n")
			out = ""
			done = 0
			for (i = 1; i <= n; i++) {
				head = toupper(arr[i])
				if (!done && match(head, /^[ \t]*CREATE[ \t]+(OR[ \t]+REPLACE[ \t]+)?(FUNCTION|PROCEDURE)[ \t]/)) {
					if (head ~ /^[ \t]*CREATE[ \t]+(OR[ \t]+REPLACE[ \t]+)?PROCEDURE/)
						sub(/FUNCTION$/, "PROCEDURE", verb)
					arr[i] = verb " " substr(arr[i], RLENGTH + 1)
					done = 1
				}
				out = out arr[i] (i < n ? "\n" : "")
			}
			if (!done)
				fail("write CREATE FUNCTION " held_name " on one line")
			held = ""
			printf "%s", out
		}
	}
	emit(lead lines)
}

# A statement of the hand part: what it drops (before the functions, or
# at all) and whether it creates or comments a function. A function it
# drops without IF EXISTS must be one the old version has, as its COMMENT
# ON FUNCTION names it.
function hand_statement(code,    rest, sig, sure) {
	if (code ~ /^CREATE (OR REPLACE )?(FUNCTION|PROCEDURE) /)
		hand_created[created_name(code)] = 1
	else if (code ~ /^COMMENT ON (FUNCTION|PROCEDURE) /)
		hand_commented[sig_name(comment_sig(code))] = 1
	else if (code ~ /^DROP (FUNCTION|PROCEDURE|ROUTINE) /) {
		rest = code
		sure = (rest !~ /^DROP [A-Z]+ IF EXISTS /)
		sub(/^DROP [A-Z]+ (IF EXISTS )?/, "", rest)
		while (rest != "") {
			sig = signature(rest)
			if (sure && !(sig in old_sig) && !(sig in old_name))
				fail("drops function " sig ", which the old version (" old_file ") does not have under that signature")
			if (!after_marker)
				dropped[sig] = 1
			dropped_any[sig] = 1
			rest = substr(rest, sigend + 1)
			sub(/^[ ,]+/, "", rest)
			if (rest ~ /^(CASCADE|RESTRICT|;)/)
				break
		}
	}
}

FNR == 1 {
	if (nfile > 0 && (st != "" || instmt))
		fail_prev()
	nfile++
	if (nfile == 1)
		old_file = FILENAME
	st = ""
	instmt = 0
	lines = ""
	code = ""
	lead = ""
	if (nfile == 2) {
		hand_file = FILENAME
		after_marker = 0
		markers = 0
		printf "-- Built by make (sql/upgrade.awk) from %s and the functions\n", FILENAME
		printf "-- of sql/install/*.sql: edit those, not this file.\n"
	}
	if (nfile == 3)
		print_functions_head()
	if (nfile >= 3)
		part_started = 0
}

function fail_prev() {
	printf "%s: the last statement does not end\n", prev_file > "/dev/stderr"
	failed = 1
	exit 1
}

function print_functions_head() {
	if (markers != 1) {
		printf "%s: needs one line \"-- @functions@\" (where the functions go), has %d\n", hand_file, markers > "/dev/stderr"
		failed = 1
		exit 1
	}
	printf "--\n-- The functions, as the install parts define them (put here by make).\n--\n"
}

{
	prev_file = FILENAME
	raw = $0
	if (nfile == 2) {
		if (!instmt && st == "" && raw ~ /^--[ \t]*@functions@/) {
			markers++
			after_marker = 1
			next
		}
		if (after_marker)
			post = post raw "\n"
		else
			print raw
	}
	if (!instmt && st == "") {
		if (raw ~ /^[ \t\r]*$/) {
			lead = ""
			next
		}
		if (raw ~ /^[ \t]*--/) {
			lead = lead raw "\n"
			next
		}
		# A psql command (the \echo guard) is a line of its own.
		if (raw ~ /^\\/) {
			lead = ""
			next
		}
	}
	instmt = 1
	lex(raw)
	lines = lines raw "\n"
	code = code " " lcode
	if (lend) {
		code = squash(code)
		if (nfile == 1) {
			if (kind(code) == "comment") {
				sig = comment_sig(code)
				old_sig[sig] = 1
				old_name[sig_name(sig)] = 1
			}
		} else if (nfile == 2) {
			hand_statement(code)
		} else {
			if (kind(code) != "" && !part_started) {
				printf "\n-- %s\n", FILENAME
				part_started = 1
			}
			install_statement(lines, code, lead)
		}
		instmt = 0
		lines = ""
		code = ""
		lead = ""
	}
}

END {
	if (failed)
		exit 1
	if (st != "" || instmt) {
		printf "%s: the last statement does not end\n", FILENAME > "/dev/stderr"
		exit 1
	}
	if (nfile < 3) {
		print "usage: awk -f sql/upgrade.awk OLD_INSTALL_SCRIPT HAND_PART INSTALL_PART..." > "/dev/stderr"
		exit 1
	}
	if (held != "") {
		printf "%s: function %s has no COMMENT ON FUNCTION\n", FILENAME, held_name > "/dev/stderr"
		exit 1
	}
	# A function of the old version that the new one no longer has (under
	# that signature) would stay behind: the hand part drops it.
	for (sig in old_sig) {
		if (!(sig in install_sig) && !(sig in dropped_any) && !(sig_name(sig) in dropped_any)) {
			printf "%s: function %s of %s is not in the install parts: drop it\n", hand_file, sig, old_file > "/dev/stderr"
			failed = 1
		}
	}
	if (failed)
		exit 1
	printf "\n--\n-- The rest of %s: what needs the functions.\n--\n%s", hand_file, post
}
