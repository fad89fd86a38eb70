"""rapidmount-emulator: a local Storage v2 gRPC service with Rapid (zonal) semantics.

Google's official client (``google-cloud-storage``'s AsyncGrpcClient,
AsyncAppendableObjectWriter, AsyncMultiRangeDownloader, the GAPIC
``StorageAsyncClient`` and ``google-cloud-storage-control``) accepts it as
the real service when pointed at ``emu.endpoint`` with anonymous credentials.

    from rapidmount.emulator import Emulator
    with Emulator(buckets={"demo": "zonal"}) as emu:
        emu.seed("demo", "dir/a.bin", b"...")
        ...  # talk gRPC to emu.endpoint

Bucket kinds: ``zonal`` (Rapid: appendable objects, HNS folders, location
type "zone"), ``hns`` (regional, folders) and ``flat`` (regional, no folders).
Fault specs: see ``rapidmount.emulator.faults``. ``stream_bandwidth=``
(``--stream-bandwidth``) caps each read stream: see ``rapidmount.emulator.pacing``.
"""

from .faults import FAULT_KINDS, FaultSpecError, parse_fault
from .server import Emulator, EmulatorServer, emulator_running
from .store import BUCKET_KINDS, Store

__all__ = ["Emulator", "EmulatorServer", "emulator_running", "Store", "BUCKET_KINDS",
           "FAULT_KINDS", "FaultSpecError", "parse_fault"]
