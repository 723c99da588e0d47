#!/bin/bash
# Several Slurm jobs writing one output file (sbatch -o FILE --open-mode=append), on a one-node
# cluster made by tests/slurm.py.  Each job is `srun python trainer.py MODE`.
#   slurm_jobs.sh OUT crash-then-done   # job 1: shape error at step 23; job 2: the same script finishes
#   slurm_jobs.sh OUT done-then-timeout # job 1 finishes; job 2 (3000 steps) hits its 1-minute time limit
set -u
out=$1; plan=$2
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
submit() {  # MODE [sbatch options]
    local mode=$1; shift
    sbatch --parsable --wait -o "$out" --open-mode=append "$@" \
        --wrap "echo \"job \$SLURM_JOB_ID on \$(hostname): trainer.py $mode\"; srun $py $here/trainer.py $mode"
}
case $plan in
    crash-then-done) submit shape-error; submit plain ;;
    done-then-timeout) submit plain; submit long --time=1 ;;
esac
