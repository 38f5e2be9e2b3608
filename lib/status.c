#include <pdx/status.h>

const char *pdx_status_str(pdx_status_t s)
{
	switch (s) {
	case PDX_OK: return "ok";
	case PDX_EAGAIN: return "nothing now";
	case PDX_EINVAL: return "invalid argument or message";
	case PDX_ERANGE: return "outside the registered layout";
	case PDX_ENOENT: return "unknown transfer";
	case PDX_EEXIST: return "transfer id already in use";
	case PDX_ETIMEDOUT: return "timed out";
	case PDX_ECANCELED: return "aborted";
	case PDX_EPERM: return "not allowed for this peer";
	case PDX_ETOOBIG: return "over a configured bound";
	case PDX_EPEER: return "peer unreachable";
	case PDX_EINCOMPAT: return "peer incompatible";
	case PDX_ENOMEM: return "out of memory";
	case PDX_EIO: return "i/o failure";
	case PDX_ENOTREG: return "engine memory not registered";
	case PDX_EAGENT: return "the engine's agent went away";
	}
	return "unknown status";
}
