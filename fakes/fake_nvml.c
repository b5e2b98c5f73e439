/*
 * A small stand-in for libnvidia-ml.so.1, loaded by the real pynvml in tests.
 *
 * It implements the NVML calls the node agent makes, with the documented signatures and struct
 * layouts, for a node chosen by environment variables read at nvmlInitWithFlags():
 *
 *   FAKE_NVML_LAYOUT    nvswitch8  8 GPUs, 18 NVLinks each to NVSwitches (one island, HGX)
 *                       islands2x4 8 GPUs, two groups of 4 joined by direct NVLinks (4 per pair)
 *                       pcie8      8 GPUs, no NVLink
 *                       nodriver   nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED
 *   FAKE_NVML_XID_FILE  a file "GPU_INDEX XID": the next nvmlEventSetWait delivers that XID
 *                       critical-error event on that GPU and removes the file.
 *   FAKE_NVML_FAIL_FILE while this file exists, every call (init and a wait in progress
 *                       included) fails with NVML_ERROR_GPU_IS_LOST: the driver lost the GPUs
 *                       mid-run. Remove the file and NVML answers again.
 *
 * GPUs 0-3 sit on NUMA node 0 and 4-7 on NUMA node 1; pairs (0,1), (2,3)... share a PCIe switch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_TIMEOUT 10
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

#define GPUS 8
#define MAX_LINKS 18
#define XID_CRITICAL_ERROR 0x8ULL

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct fake_device {
    int index;
} fake_device;

typedef fake_device *nvmlDevice_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

typedef struct fake_event_set {
    unsigned long long registered[GPUS];
} *nvmlEventSet_t;

enum layout { NVSWITCH8, ISLANDS2X4, PCIE8 };

static fake_device devices[GPUS];
static enum layout current = NVSWITCH8;
static int initialized = 0;
static struct fake_event_set event_set;

static int valid(nvmlDevice_t dev) {
    return initialized && dev >= &devices[0] && dev < &devices[GPUS];
}

static int failing(void) {
    const char *path = getenv("FAKE_NVML_FAIL_FILE");
    return path != NULL && access(path, F_OK) == 0;
}

#define FAIL_IF_SWITCHED()                                                                         \
    do {                                                                                           \
        if (failing()) return NVML_ERROR_GPU_IS_LOST;                                              \
    } while (0)

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    FAIL_IF_SWITCHED();
    (void)flags;
    const char *layout = getenv("FAKE_NVML_LAYOUT");
    if (layout == NULL || strcmp(layout, "nvswitch8") == 0) {
        current = NVSWITCH8;
    } else if (strcmp(layout, "islands2x4") == 0) {
        current = ISLANDS2X4;
    } else if (strcmp(layout, "pcie8") == 0) {
        current = PCIE8;
    } else if (strcmp(layout, "nodriver") == 0) {
        return NVML_ERROR_DRIVER_NOT_LOADED;
    } else {
        return NVML_ERROR_UNKNOWN;
    }
    for (int i = 0; i < GPUS; i++) devices[i].index = i;
    memset(&event_set, 0, sizeof event_set);
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    FAIL_IF_SWITCHED();
    if (length < 16) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(version, length, "570.00-fake");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    FAIL_IF_SWITCHED();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *count = GPUS;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    FAIL_IF_SWITCHED();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (index >= GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    FAIL_IF_SWITCHED();
    if (!valid(dev)) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)dev->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    FAIL_IF_SWITCHED();
    if (!valid(dev)) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(name, length, "NVIDIA H100 80GB HBM3");
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    FAIL_IF_SWITCHED();
    if (!valid(dev)) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(uuid, length, "GPU-fa4e0000-0000-4000-8000-00000000000%d", dev->index);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t dev, int *node) {
    FAIL_IF_SWITCHED();
    if (!valid(dev)) return NVML_ERROR_INVALID_ARGUMENT;
    *node = dev->index < 4 ? 0 : 1;
    return NVML_SUCCESS;
}

static void fill_pci(nvmlPciInfo_t *pci, unsigned int bus) {
    memset(pci, 0, sizeof *pci);
    pci->bus = bus;
    pci->pciDeviceId = 0x233010de;
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", bus);
}

static unsigned int gpu_bus(int index) { return 0x18 + 0x10 * (unsigned int)index; }

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    FAIL_IF_SWITCHED();
    if (!valid(dev)) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(pci, gpu_bus(dev->index));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level) {
    FAIL_IF_SWITCHED();
    if (!valid(a) || !valid(b)) return NVML_ERROR_INVALID_ARGUMENT;
    if (a == b) *level = 0;
    else if (a->index / 2 == b->index / 2) *level = 10;       /* PIX: one PCIe switch */
    else if (a->index / 4 == b->index / 4) *level = 40;       /* NODE: same NUMA node */
    else *level = 50;                                         /* SYS: across sockets */
    return NVML_SUCCESS;
}

/* islands2x4: link l of GPU i goes to the (l / 4)-th other GPU of its group of four. */
static int peer_of(int index, unsigned int link) {
    int group = index / 4, nth = (int)(link / 4), seen = 0;
    for (int j = group * 4; j < group * 4 + 4; j++) {
        if (j == index) continue;
        if (seen++ == nth) return j;
    }
    return -1;
}

static nvmlReturn_t link_ok(nvmlDevice_t dev, unsigned int link) {
    FAIL_IF_SWITCHED();
    if (!valid(dev)) return NVML_ERROR_INVALID_ARGUMENT;
    if (current == PCIE8) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, unsigned int *active) {
    FAIL_IF_SWITCHED();
    nvmlReturn_t ok = link_ok(dev, link);
    if (ok != NVML_SUCCESS) return ok;
    *active = current == NVSWITCH8 ? 1 : (link < 12 ? 1 : 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t dev, unsigned int link,
                                                 nvmlPciInfo_t *pci) {
    FAIL_IF_SWITCHED();
    nvmlReturn_t ok = link_ok(dev, link);
    if (ok != NVML_SUCCESS) return ok;
    if (current == NVSWITCH8) {
        fill_pci(pci, 0xC0 + link % 4); /* four NVSwitch chips on the baseboard */
        return NVML_SUCCESS;
    }
    int peer = peer_of(dev->index, link);
    if (peer < 0) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(pci, gpu_bus(peer));
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t dev, unsigned int link, int *type) {
    FAIL_IF_SWITCHED();
    nvmlReturn_t ok = link_ok(dev, link);
    if (ok != NVML_SUCCESS) return ok;
    *type = current == NVSWITCH8 ? 2 : 0; /* NVML_NVLINK_DEVICE_TYPE_SWITCH : _GPU */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    FAIL_IF_SWITCHED();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *set = &event_set;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev, unsigned long long *types) {
    FAIL_IF_SWITCHED();
    if (!valid(dev)) return NVML_ERROR_INVALID_ARGUMENT;
    *types = XID_CRITICAL_ERROR;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types,
                                      nvmlEventSet_t set) {
    FAIL_IF_SWITCHED();
    if (!valid(dev) || set != &event_set) return NVML_ERROR_INVALID_ARGUMENT;
    set->registered[dev->index] |= types;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int ms) {
    FAIL_IF_SWITCHED();
    if (!initialized || set != &event_set) return NVML_ERROR_INVALID_ARGUMENT;
    const char *path = getenv("FAKE_NVML_XID_FILE");
    unsigned int waited = 0;
    for (;;) {
        FAIL_IF_SWITCHED();
        if (path != NULL) {
            FILE *f = fopen(path, "r");
            if (f != NULL) {
                int index = -1;
                unsigned long long xid = 0;
                int read = fscanf(f, "%d %llu", &index, &xid);
                fclose(f);
                unlink(path);
                if (read == 2 && index >= 0 && index < GPUS &&
                    (set->registered[index] & XID_CRITICAL_ERROR)) {
                    memset(data, 0, sizeof *data);
                    data->device = &devices[index];
                    data->eventType = XID_CRITICAL_ERROR;
                    data->eventData = xid;
                    return NVML_SUCCESS;
                }
            }
        }
        if (waited >= ms) return NVML_ERROR_TIMEOUT;
        struct timespec step = {0, 20 * 1000 * 1000};
        nanosleep(&step, NULL);
        waited += 20;
    }
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    (void)set;
    return NVML_SUCCESS;
}
