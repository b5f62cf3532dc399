#!/bin/bash
# One node's launch, run on every training node by multinode.sbatch (srun, one task per node): SLURM_PROCID is this
# node's rank; MAIN_NODE, MAIN_PORT, TRAIN_NODES and GPUS_PER_NODE come from the sbatch script. ACCELERATE_CONFIG
# picks another accelerate config (default: DDP; accelerate_configs/multi_node_zero3.yaml for ZeRO-3).
set -euo pipefail
exec accelerate launch --config_file "${ACCELERATE_CONFIG:-accelerate_configs/multi_node_ddp.yaml}" \
    --num_machines "$TRAIN_NODES" --num_processes $((TRAIN_NODES * GPUS_PER_NODE)) --machine_rank "$SLURM_PROCID" \
    --main_process_ip "$MAIN_NODE" --main_process_port "$MAIN_PORT" examples/train.py "$@"
