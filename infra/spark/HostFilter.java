// The stack's Spark master and worker web UIs answer only requests addressed to the stack's own host names
// (`dssm stack up` builds this into STACK_DIR/spark/host-filter-*.jar and names it in spark.ui.filters): a web
// page whose DNS name was rebound to 127.0.0.1 sends its own name as Host and is refused with 403, as MLflow
// and Prefect refuse it. The allowed names come from the filter's `hosts` parameter
// (spark.dssm.HostFilter.param.hosts), host names without ports.
package dssm;

import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.FilterConfig;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.util.HashSet;
import java.util.Locale;
import java.util.Set;

public class HostFilter implements Filter {
    private final Set<String> allowed = new HashSet<>();

    @Override
    public void init(FilterConfig config) {
        String hosts = config.getInitParameter("hosts");
        if (hosts == null) hosts = "127.0.0.1,localhost";
        for (String h : hosts.split(",")) allowed.add(h.trim().toLowerCase(Locale.ROOT));
    }

    @Override
    public void doFilter(ServletRequest req, ServletResponse res, FilterChain chain) throws IOException, ServletException {
        String host = ((HttpServletRequest) req).getHeader("Host");
        String name = host == null ? "" : host.trim().toLowerCase(Locale.ROOT);
        if (name.startsWith("[")) name = name.substring(0, name.indexOf(']') + 1);
        else if (name.indexOf(':') >= 0) name = name.substring(0, name.lastIndexOf(':'));
        if (!allowed.contains(name)) {
            ((HttpServletResponse) res).sendError(403, "this Host is not one of the stack's own");
            return;
        }
        chain.doFilter(req, res);
    }

    @Override
    public void destroy() {}
}
