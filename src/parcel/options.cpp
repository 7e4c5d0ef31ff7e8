// options.cpp — the parcel layer's option table (the ferry parcelport's design space).
#include "ferry/parcel.hpp"

namespace ferry::parcel {

const ParcelOptionTable& option_table() {
  using O = ParcelportOptions;
  using S = Settings;
  using T = OptionType;
  static const ParcelOptionTable table(
      "parcel", "ParcelportOptions",
      {
          option({"header", "FERRY_HEADER", T::choice, "am", {"am", "sendrecv"}, 0, 0, nullptr,
                  "parcel header primitive: am, sendrecv"},
                 &O::header, &S::header),
          option({"device_polling", "FERRY_DEVICE_POLLING", T::choice, "local", {"local", "random", "global"}, 0, 0,
                  nullptr, "which devices an idle thread polls: local, random, global"},
                 &O::device_polling, &S::device_polling),
          option({"parcel_queues", "FERRY_PARCEL_QUEUES", T::choice, "shared", {"shared", "device"}, 0, 0, nullptr,
                  "the ferry parcelport's completion queues: shared (one for every device), device (one "
                  "per device, drained only by the threads that poll it)"},
                 &O::parcel_queues, &S::parcel_queues),
      });
  return table;
}

}  // namespace ferry::parcel
