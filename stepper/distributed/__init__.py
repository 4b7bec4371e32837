"""A model on the ranks of an MPI job (mpi4py): domain decomposition with differentiable halo
exchanges (`Distributed`) and ensembles of independent members split over the ranks (`Ensemble`).

    from stepper.distributed import Distributed, Ensemble
"""
from .domain import Distributed, Partition, rank_path, require_mpi
from .ensemble import Ensemble, EnsembleResult, Member

__all__ = ["Distributed", "Partition", "rank_path", "require_mpi", "Ensemble", "EnsembleResult", "Member"]
