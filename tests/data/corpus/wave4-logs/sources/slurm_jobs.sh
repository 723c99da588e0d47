#!/bin/bash
# Several Slurm jobs writing one output file (sbatch -o FILE --open-mode=append), on a one-node
# cluster made by tests/slurm.py.  Each job is `srun python trainer.py MODE`.
#   slurm_jobs.sh OUT crash-then-done   # job 1: shape error at step 23; job 2: the same script finishes
#   slurm_jobs.sh OUT done-then-timeout # job 1 finishes; job 2 (3000 steps) hits its 1-minute time limit
#   slurm_jobs.sh OUT restart-then-tasks # job 1: torchrun whose rank 0 is SIGKILLed once, the restart finishes;
#                                        # job 2: two tasks of srun -n 2, both meeting the shape error
set -u
out=$1; plan=$2
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
submit() {  # MODE [sbatch options]
    local mode=$1; shift
    sbatch --parsable --wait -o "$out" --open-mode=append "$@" \
        --wrap "echo \"job \$SLURM_JOB_ID on \$(hostname): trainer.py $mode\"; srun $py $here/trainer.py $mode"
}
submit_cmd() {  # COMMAND (run by the job's shell) [sbatch options]
    local cmd=$1; shift
    sbatch --parsable --wait -o "$out" --open-mode=append "$@" --wrap "echo \"job \$SLURM_JOB_ID on \$(hostname): $cmd\"; $cmd"
}
case $plan in
    crash-then-done) submit shape-error; submit plain ;;
    done-then-timeout) submit plain; submit long --time=1 ;;
    restart-then-tasks)
        submit_cmd "srun ${TORCHRUN:-torchrun} --nproc_per_node 2 --max-restarts 1 $here/trainer.py elastic-sigkill-once" -n 1 -c 2
        submit_cmd "srun -n 2 $py $here/trainer.py shape-error" -n 2 ;;
esac
