"""What the pdx-xferbench tests share: checks that collect their failures
(every check runs; finish() ends the test failed if any did), and a run
of the benchmark that must exit as wanted."""
import subprocess
import sys

# a run's iterations and transfers in flight (run()'s defaults)
ITERS = 2
CONC = 2
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr)


def run(xb, agent, args, want_rc=0, iters=ITERS, conc=CONC):
    """pdx-xferbench with args, random blocks, iters iterations of conc
    transfers; exits the test when its exit status is not want_rc."""
    p = subprocess.run([xb, "--iters", str(iters), "--concurrency",
                        str(conc), "--random-blocks", "--agent-bin", agent] +
                       args, capture_output=True, text=True, timeout=120)
    if p.returncode != want_rc:
        sys.stderr.write(p.stderr)
        sys.exit("pdx-xferbench %s exited %d, want %d" %
                 (" ".join(args), p.returncode, want_rc))
    return p


def finish():
    if failures:
        sys.exit(1)
